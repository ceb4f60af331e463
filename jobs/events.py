"""Live job events (pools/events.py): on commit, each transition goes to the job's tenant, to
operators and to followers of the job itself, at /ws/jobs/."""

from pools.events import groups_of, publish_event

STREAM = "jobs"


def publish_job_event(job, _event=None) -> None:
    """Wakes the sockets that may see `job`'s events; they read the event itself (the
    transition's `_event`, committed) from the event table."""
    publish_event(groups_of(STREAM, job))
