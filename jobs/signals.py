"""What a job's lifecycle tells the layers above (scheduling), without jobs importing them.
Sent synchronously inside the sender's transaction, after the job's row lock, so a receiver's
writes commit or roll back with the job's own; a receiver that raises stops the sender.

The scheduling app connects its receivers in its AppConfig.ready() (scheduling/receivers.py).
"""

from django.dispatch import Signal

# A job was cancelled (jobs.services.job_cancel): job (its row locked, now cancelled), actor.
# A preemption decided for it is called off at once (scheduling/preemption.py).
job_cancelled = Signal()

# Jobs were queued: pool_id. Sent by jobs.services.job_submit inside its transaction, by
# jobs_submit_many after its write (inside the caller's transaction, if any). The control loop
# asks for a pass of that pool once it commits (scheduling/receivers.py).
jobs_submitted = Signal()

# A job reached a terminal state (succeeded, failed, cancelled, lost): job_id, state. Sent once
# the transaction that ended it commits (jobs.services.job_transition), never inside it: the
# observability app exports the job's trace then (observability/receivers.py).
job_ended = Signal()
