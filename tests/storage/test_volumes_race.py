"""Real races on PostgreSQL (threads, each with its own connection): two volumes created at
once for a node whose disk fits one; two read-write jobs attaching one volume at once; a
submit that mounts a volume and its delete at once."""

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, build_tenant, submit_job
from jobs.choices import TERMINAL, JobState
from jobs.models import Job
from jobs.services import job_transition
from leases.selectors import ledger_problems
from pools.reasons import Reason
from scheduling.pass_steps.single import place_one
from storage import services
from storage.models import Volume, VolumeAttachment
from storage.services import VolumeRefused

pytestmark = pytest.mark.django_db(transaction=True)


def race(count, target) -> list:
    barrier = threading.Barrier(count)
    outcomes = [None] * count

    def run(i):
        try:
            barrier.wait()
            outcomes[i] = target(i)
        except Exception as exc:  # the loser's refusal, asserted below
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def test_two_volumes_racing_for_a_disk_that_fits_one():
    pool = build_pool("vrace", exact_capacity=True)
    tenant = build_tenant("vrace-t")
    node = build_node(pool, "only", scratch=1500)
    for _ in range(3):  # a few rounds: the race must hold every time
        outcomes = race(
            2,
            lambda i: services.volume_create(
                tenant=tenant, pool=pool, name=f"v{i}-{Volume.objects.count()}", size_mib=1000,
                actor=SYSTEM,
            ),
        )  # fmt: skip
        won = [o for o in outcomes if isinstance(o, Volume)]
        lost = [o for o in outcomes if not isinstance(o, Volume)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert lost[0].code == "volume_node_full"
        node.refresh_from_db()
        assert node.scratch_mib_reserved == 1000 <= node.scratch_mib_allocatable
        assert ledger_problems(pool) == []
        services.volume_delete(volume=won[0], actor=SYSTEM)
        services.volumes_reconcile(node=node, reported=[])  # the node says the image is gone


def test_two_read_write_jobs_racing_for_one_volume():
    pool = build_pool("vrace2", exact_capacity=True)
    tenant = build_tenant("vrace2-t")
    build_node(pool, "n")
    volume = services.volume_create(tenant=tenant, pool=pool, name="v", size_mib=10, actor=SYSTEM)
    for round_ in range(3):
        jobs = [1000 + 10 * round_, 1001 + 10 * round_]
        outcomes = race(
            2,
            lambda i, jobs=jobs: services.volume_attach(
                volume_id=volume.pk, job_id=jobs[i], read_only=False, actor=SYSTEM
            ),
        )
        won = [o for o in outcomes if isinstance(o, Volume)]
        assert len(won) == 1, outcomes
        assert [o.code for o in outcomes if not isinstance(o, Volume)] == ["volume_in_use"]
        assert VolumeAttachment.objects.filter(volume=volume, read_only=False).count() == 1
        holder = Volume.objects.get(pk=volume.pk).holder_job_id
        assert holder in jobs
        services.volumes_detach(job_id=holder, actor=SYSTEM)


def test_a_submit_and_a_delete_racing_never_leave_a_job_waiting_for_a_deleted_volume():
    """The submit locks the volume and checks it again in its transaction; the delete looks for
    the jobs that mount it under the same lock: one of the two wins, never both."""
    pool = build_pool("vrace3", exact_capacity=True)
    tenant = build_tenant("vrace3-t")
    build_node(pool, "n")
    outcomes_seen = set()
    for round_ in range(4):
        volume = services.volume_create(
            tenant=tenant, pool=pool, name=f"v{round_}", size_mib=10, actor=SYSTEM
        )
        mounts = [{"volume": volume.pk, "path": "/data", "read_only": False}]

        def act(i, volume=volume, mounts=mounts):
            if i == 0:
                return submit_job(pool, tenant, f"j{volume.pk}", volumes=mounts)
            return services.volume_delete(volume=volume, actor=SYSTEM)

        submitted, deleted = race(2, act)
        if isinstance(submitted, Job):
            assert isinstance(deleted, VolumeRefused) and deleted.code == "volume_in_use"
            assert deleted.extra["jobs"] == [submitted.pk]
            outcomes_seen.add("job first")
        else:
            assert isinstance(submitted, ValidationError), submitted
            assert isinstance(deleted, Volume) and deleted.state == "deleted"
            outcomes_seen.add("delete first")
        waiting = Job.objects.filter(pool=pool).exclude(state__in=TERMINAL)
        for job in waiting:
            for mount in job.volumes:
                assert Volume.objects.get(pk=mount["volume"]).state in ("available", "attached")
    assert outcomes_seen  # which one wins is the race's: both answers are checked above


def test_two_single_path_placements_of_writers_of_one_volume_racing_place_one():
    """`place_one` (the single path's `lease_reserve`) for two jobs that write one volume, at
    once: the volume's row lock makes them take turns, and the second sees the first placed."""
    pool = build_pool("vrace4", exact_capacity=True)
    tenant = build_tenant("vrace4-t")
    build_node(pool, "n", cpu=16000, memory=16384)
    volume = services.volume_create(tenant=tenant, pool=pool, name="v", size_mib=10, actor=SYSTEM)
    mounts = [{"volume": volume.pk, "path": "/data", "read_only": False}]
    for round_ in range(3):
        jobs = [
            submit_job(pool, tenant, f"w{round_}-{i}", cpu=500, memory=256, volumes=mounts)
            for i in range(2)
        ]
        now = timezone.now()
        outcomes = race(2, lambda i, jobs=jobs, now=now: place_one(jobs[i].pk, now))
        assert sorted(outcomes, key=str) == [True, "volume_in_use"], outcomes
        states = sorted(
            Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)
        )
        assert states == [JobState.LEASED, JobState.QUEUED]
        for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
            job_transition(
                job=job, to=JobState.CANCELLED, actor=SYSTEM, reason=Reason.CANCELLED_BY_USER
            )
