"""Live job events (pools/events.py): on commit, each transition goes to the job's tenant, to
operators and to followers of the job itself, at /ws/jobs/."""

from pools.events import event_fields, groups_of, publish_event

STREAM = "jobs"


def publish_job_event(job, event) -> None:
    publish_event(
        groups_of(STREAM, job),
        {"job": job.pk, "name": job.name, "state": job.state, **event_fields(event)},
    )
