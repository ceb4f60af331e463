"""What storage asks the layers above (jobs), without importing them. Sent synchronously
inside the sender's transaction.

The jobs app connects its receiver in its AppConfig.ready() (jobs/receivers.py)."""

from django.dispatch import Signal

# Which jobs that have not ended mount a volume (queued, placed, running …): sender Volume,
# volume_id. Each receiver answers a list of job ids. A volume such a job mounts is neither
# deleted (409 `volume_in_use`, with the ids) nor expired by retention: a queued job would
# otherwise wait for a volume that is gone (docs/storage.md "Persistent volumes").
volume_jobs = Signal()
