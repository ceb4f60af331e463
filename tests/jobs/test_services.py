"""The jobs' services: the batch pass's bulk queued → leased checks the transition map as
`job_transition` does."""

import pytest
from django.db import transaction
from django.utils import timezone

from config.builders import submit_job
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_cancel, jobs_placed_many
from pools.actors import Actor
from pools.statemachine import TransitionRefused

ACTOR = Actor.system("scheduler")


def note(job, node="n1"):
    return (job.pk, f"placed on {node}", {"node": node})


def test_jobs_placed_many_moves_queued_jobs_with_their_events(lpool, ltenant):
    jobs = [submit_job(lpool, ltenant, f"j{i}") for i in range(2)]
    base = jobs_placed_many([note(job) for job in jobs], actor=ACTOR, now=timezone.now())
    assert (base.from_state, base.to_state, base.reason) == ("queued", "leased", "placed")
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        assert (job.state, job.attempts, job.pending_reason) == (JobState.LEASED, 1, {})
        assert job.events.get(reason="placed").data == {"node": "n1"}
    assert jobs_placed_many([], actor=ACTOR, now=timezone.now()) is None


def test_jobs_placed_many_refuses_a_job_that_is_not_queued(lpool, ltenant):
    queued, cancelled = (submit_job(lpool, ltenant, name) for name in ("queued", "cancelled"))
    job_cancel(job=cancelled, actor=ACTOR)
    events = JobEvent.objects.count()
    with pytest.raises(TransitionRefused) as refused, transaction.atomic():
        jobs_placed_many([note(queued), note(cancelled)], actor=ACTOR, now=timezone.now())
    assert refused.value.code == "transition_not_allowed"
    assert "1 of 2 jobs are not queued" in refused.value.message
    assert Job.objects.get(pk=queued.pk).state == JobState.QUEUED  # the caller rolled back
    assert JobEvent.objects.count() == events


def test_a_job_that_names_no_class_gets_the_pools_default_class_never_the_lowest(pool, tenant):
    """A member's `batch` flood starved every tenant that left the class out (0, the same as
    `scavenger`): such a job now takes the pool's `default_priority_class`."""
    from config.builders import SYSTEM, submit_job
    from pools.models import PriorityClass
    from pools.services import policy_version_publish

    PriorityClass.objects.create(name="scavenger", value=0)
    batch = PriorityClass.objects.create(name="batch", value=100)
    assert submit_job(pool, tenant, "before").priority_class is None
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=current.policy,
        weights=current.weights,
        knobs={**current.knobs, "default_priority_class": "batch"},
        actor=SYSTEM,
    )
    assert submit_job(pool, tenant, "after").priority_class == batch
    scavenger = PriorityClass.objects.get(name="scavenger")
    assert submit_job(pool, tenant, "named", priority=scavenger).priority_class == scavenger
