"""One writer per volume on every path of the pass (docs/storage.md "Persistent volumes"): the
single path (`lease_reserve`, scheduling/pass_steps/single.py) refuses a second writer like the
batch path; a gang tried and not placed gives back the volumes its members claimed within that
pass. Racing single-path placements: test_volumes_race.py."""

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, build_tenant, submit_job
from jobs.choices import JobState
from jobs.services import job_transition
from pools.reasons import Reason
from scheduling.pass_steps.outcomes import PassResult
from scheduling.pass_steps.single import one_by_one
from scheduling.passes import scheduling_pass
from storage import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool():
    return build_pool("vwr", exact_capacity=True)


@pytest.fixture
def tenant():
    return build_tenant("vwr-a")


def writes(pool, tenant, volume, name, **fields):
    mounts = [{"volume": volume.pk, "path": "/data", "read_only": False}]
    return submit_job(pool, tenant, name, cpu=500, memory=256, volumes=mounts, **fields)


def test_the_single_path_places_one_writer_of_a_volume_and_the_other_waits(pool, tenant):
    build_node(pool, "home", cpu=8000)
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=10, actor=SYSTEM)
    first, second = writes(pool, tenant, volume, "w1"), writes(pool, tenant, volume, "w2")
    result = PassResult()
    one_by_one([first.pk, second.pk], timezone.now(), result)
    first.refresh_from_db(), second.refresh_from_db()
    assert first.state == JobState.LEASED and result.placed == [first.pk]
    assert second.state == JobState.QUEUED
    assert second.pending_reason["code"] == "volume_in_use"
    assert second.pending_reason["volume"] == volume.pk
    # the first one ends: the second is placed by the same path
    job_transition(job=first, to=JobState.CANCELLED, actor=SYSTEM, reason=Reason.CANCELLED_BY_USER)
    result = PassResult()
    one_by_one([second.pk], timezone.now(), result)
    second.refresh_from_db()
    assert second.state == JobState.LEASED and result.placed == [second.pk]


def test_a_gang_not_placed_gives_back_the_volumes_its_members_claimed(pool, tenant):
    build_node(pool, "home", cpu=16000, memory=16384)
    v, w, u = (
        services.volume_create(tenant=tenant, pool=pool, name=n, size_mib=10, actor=SYSTEM)
        for n in ("v", "w", "u")
    )
    holder = writes(pool, tenant, w, "holds-w")
    scheduling_pass()
    holder.refresh_from_db()
    assert holder.state == JobState.LEASED
    # gang A: a1 writes v (admitted, claims it), a2 writes w (held): the gang waits
    gang_a = {"name": "ga", "size": 2, "topology": "none"}
    a1, a2 = writes(pool, tenant, v, "a1", gang=gang_a), writes(pool, tenant, w, "a2", gang=gang_a)
    # gang B, after A in the queue: b1 writes v, b2 writes u; v is free once A let go of it
    gang_b = {"name": "gb", "size": 2, "topology": "none"}
    b1, b2 = writes(pool, tenant, v, "b1", gang=gang_b), writes(pool, tenant, u, "b2", gang=gang_b)
    scheduling_pass()
    for job in (a1, a2, b1, b2):
        job.refresh_from_db()
    assert a1.state == a2.state == JobState.QUEUED
    assert a2.pending_reason["code"] == "volume_in_use"
    assert b1.state == b2.state == JobState.LEASED, (b1.pending_reason, b2.pending_reason)
