"""The steps of a scheduling pass (scheduling/passes.py runs them: read → plan → apply).

- `window`: which queued jobs a pass considers, read as plain rows.
- `admission`: the window's queue order, and who may take what (the queue's gate, each
  tenant's quota headroom, and why a job was refused).
- `gangs`: members of a gang formed into whole gangs, or waiting with their reason.
- `plan`: the window planned on one snapshot in the pure core.
- `apply`: the plan written in one transaction.
- `single`: the single path, one job (or one whole gang) per transaction through
  `lease_reserve` (SQLite, after a failed plan, backfill into reservations).
- `outcomes`: what a pass records of each job (placed, waiting, failed).
- `stranded`: jobs whose lease ended under them, back to the queue or lost.
"""
