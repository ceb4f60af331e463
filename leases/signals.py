"""What the ledger tells the layers above (scheduling), without leases importing them. Sent
synchronously inside the sender's transaction, so a receiver's writes commit or roll back with
the ledger's own; a receiver that raises stops the sender.

The scheduling app connects its receivers in its AppConfig.ready() (scheduling/receivers.py).
"""

from django.dispatch import Signal

# A lease that held capacity ended (leases.services.capacity.return_capacity, called by
# lifecycle.end_lease for every transition out of HOLDING): lease. Its node's capacity (or, for
# a backfill, its reservation's room) is free again once the transaction commits; the control
# loop asks for a pass of the lease's pool then.
capacity_returned = Signal()

# A lease's API answer asks what of its work is ephemeral and what persists (docs/storage.md):
# sender Lease, lease (one with a job). The jobs app answers with its job's statement
# (jobs/selectors.py `job_storage`); no answer (None) leaves the lease's own.
storage_statement = Signal()
