"""The scheduling pass turns queued jobs into leases, in priority order, and explains the rest."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config.builders import build_node, build_pool, build_tenant, submit_job
from jobs.choices import JobState
from jobs.models import Job
from leases import selectors
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import expire_leases
from pools.models import PriorityClass
from scheduling.passes import requeue_jobs_without_lease, scheduling_pass
from scheduling.tasks import scheduling_pass as scheduling_pass_task


def test_places_highest_priority_first_then_oldest(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    batch = PriorityClass.objects.create(name="batch", value=100)
    prod = PriorityClass.objects.create(name="prod", value=1000)
    old_batch = submit_job(lpool, ltenant, "old-batch", priority=batch)
    new_batch = submit_job(lpool, ltenant, "new-batch", priority=batch)
    prod_job = submit_job(lpool, ltenant, "prod", priority=prod)

    result = scheduling_pass()

    assert result.placed == [prod_job.pk, old_batch.pk]
    assert result.pending == {new_batch.pk: "no_capacity"}
    prod_job.refresh_from_db()
    assert prod_job.state == JobState.LEASED and prod_job.attempts == 1
    event = prod_job.events.latest("id")
    assert (event.to_state, event.reason, event.actor_label) == (
        "leased",
        "placed",
        "system:scheduler",
    )
    lease = Lease.objects.get(job=prod_job)
    assert lease.state == LeaseState.RESERVED and event.data["lease"] == lease.pk
    assert ledger_problems(lpool) == []


def test_a_job_that_does_not_fit_says_why(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    job = submit_job(lpool, ltenant, "too-big", cpu=1500)
    submit_job(lpool, ltenant, "fits", cpu=1000)
    scheduling_pass()  # "too-big" takes the node first (older), "fits" must then wait
    waiting = Job.objects.get(name="fits")
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason["code"] == "no_capacity"
    assert waiting.pending_reason["reasons"] == {"insufficient_cpu": 1}
    assert "n1" in waiting.pending_reason["message"] or waiting.pending_reason["nearest_miss"]
    job.refresh_from_db()
    assert job.state == JobState.LEASED and job.pending_reason == {}


def test_expired_lease_requeues_the_job_and_the_next_pass_places_it_again(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    job = submit_job(lpool, ltenant, "j")
    scheduling_pass()
    later = timezone.now() + timedelta(hours=1)
    assert expire_leases(now=later) == 1
    assert requeue_jobs_without_lease(now=later) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.events.latest("id").reason == "lease_expired"
    assert requeue_jobs_without_lease(now=later) == []  # guarded: nothing twice
    assert scheduling_pass_task.delay().get()["placed"] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.LEASED and job.attempts == 2
    assert Lease.objects.filter(job=job).count() == 2
    assert ledger_problems(lpool) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_never_place_a_job_twice_nor_overcommit():
    pool = build_pool("race", exact_capacity=True)
    tenant = build_tenant("race", name="Race")
    for i in range(3):
        build_node(pool, f"n{i}", cpu=4000, memory=8192)
    jobs = [submit_job(pool, tenant, f"j{i}", cpu=1000) for i in range(20)]  # 12 fit
    barrier = threading.Barrier(4)

    def run_pass():
        try:
            barrier.wait()
            scheduling_pass()
        finally:
            connection.close()

    threads = [threading.Thread(target=run_pass) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    leased = Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.LEASED)
    assert leased.count() == 12
    for job in leased:
        assert Lease.objects.filter(job=job).count() == 1
    assert Job.objects.filter(state=JobState.QUEUED).count() == 8
    assert selectors.overcommitted_nodes(pool) == 0
    assert ledger_problems(pool) == []
