"""Scheduler health: pass records and capacity samples, pruned to their window; the series the
pages draw (empty buckets included), lease expiries from the lease events."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from config.builders import build_node, build_pool, build_tenant
from leases.services import expire_leases, lease_reserve
from pools.actors import Actor
from pools.models import ResourceShape
from scheduling import health
from scheduling.models import CapacitySample, PassRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(db):
    return build_pool("hp", exact_capacity=True)


def test_record_pass_keeps_its_window(pool):
    now = timezone.now()
    with override_settings(SCHEDULER_HEALTH_WINDOW_HOURS=1):
        old = health.record_pass(pool_id=pool.pk, started_at=now - timedelta(hours=2), duration_s=1)
        health.record_pass(
            pool_id=pool.pk, started_at=now, duration_s=0.25, considered=5, placed=3, conflicts=1
        )
    assert not PassRecord.objects.filter(pk=old.pk).exists()  # pruned by the newer pass
    assert list(PassRecord.objects.values_list("placed", "conflicts")) == [(3, 1)]


def test_record_pass_keeps_the_phases_of_a_batch_plan(pool):
    now = timezone.now()
    health.record_pass(pool_id=pool.pk, started_at=now, duration_s=0.5)  # the single path
    phases = {"snapshot_s": 0.1, "plan_s": 0.2, "apply_s": 0.15}
    for scale in (1, 3):
        timed = {phase: seconds * scale for phase, seconds in phases.items()}
        health.record_pass(pool_id=pool.pk, started_at=now, duration_s=1.0 * scale, **timed)
    means = health.phase_means(pool, 1, now=now)
    assert means == pytest.approx({phase: seconds * 2 for phase, seconds in phases.items()})
    assert health.phase_means(pool, 1, now=now + timedelta(hours=2)) == dict.fromkeys(phases)


def test_record_pass_never_raises(pool):
    bad = health.record_pass(pool_id=pool.pk, started_at=timezone.now(), duration_s=1, placed=-1)
    assert bad is None and not PassRecord.objects.exists()  # the caller's transaction goes on


def test_pass_series_buckets_by_minute_with_quiet_minutes(pool):
    now = timezone.now().replace(second=30)
    for duration, placed in ((0.2, 4), (0.6, 2)):
        health.record_pass(pool_id=pool.pk, started_at=now, duration_s=duration, placed=placed)
    health.record_pass(
        pool_id=pool.pk, started_at=now - timedelta(minutes=5), duration_s=1.5, errors=1
    )
    series = health.pass_series(pool, 1, now=now)
    assert len(series) == 60 and series[-1]["at"] == now.replace(second=0, microsecond=0)
    last = series[-1]
    assert last["passes"] == 2 and last["placed"] == 6 and last["per_pass"] == 3
    assert last["max_s"] == pytest.approx(0.6) and last["mean_s"] == pytest.approx(0.4)
    assert series[-6]["errors"] == 1 and series[-6]["max_s"] == pytest.approx(1.5)
    assert series[-2]["passes"] == 0  # a quiet minute is a point too
    assert len(health.pass_series(pool, 24, now=now)) == 24


def test_expiry_series_counts_expired_leases(pool):
    build_node(pool, "n1", cpu=4000, memory=8192)
    tenant = build_tenant("exp")
    for _ in range(2):
        lease_reserve(
            pool=pool,
            tenant=tenant,
            request={"cpu_millicores_min": 500, "memory_mib_min": 256},
            actor=Actor.system("test"),
            duration=60,
        )
    later = timezone.now() + timedelta(minutes=5)
    assert expire_leases(now=later) == 2
    series = health.expiry_series(pool, 1, now=later + timedelta(seconds=1))
    assert sum(b["expired"] for b in series) == 2


def test_sample_capacity_and_utilisation(pool):
    node = build_node(pool, "n1", cpu=4000, memory=8192)
    now = timezone.now()
    assert health.sample_capacity(now=now - timedelta(minutes=2)) >= 1
    type(node).objects.filter(pk=node.pk).update(cpu_millicores_reserved=2000)
    health.sample_capacity(now=now - timedelta(minutes=1))
    use = health.utilisation(pool, 1, now=now)
    cpu = use["dimensions"]["cpu_millicores"]
    assert cpu["requested"] == [0.0, 50.0]
    assert cpu["requested_peak"] == 50.0 and cpu["requested_average"] == 25.0
    assert cpu["measured_peak"] == 0.0
    assert "gpu_milli" not in use["dimensions"]  # no GPUs: nothing to chart


def test_a_pool_that_cannot_be_sampled_is_recorded_and_the_others_go_on(pool):
    other = build_pool("hp2")
    build_node(pool, "n1")
    # a corrupt catalogue row (written past validation): its request cannot be built
    shape = ResourceShape.objects.create(
        pool=pool, name="broken", cpu_millicores_min=1, memory_mib_min=1
    )
    ResourceShape.objects.filter(pk=shape.pk).update(gpu_models=5)
    assert health.sample_capacity() == CapacitySample.objects.exclude(pool=pool).count()
    failed = CapacitySample.objects.get(pool=pool)
    assert failed.error and failed.totals == {}
    assert CapacitySample.objects.filter(pool=other, error="").exists()
    assert health.utilisation(pool, 1)["failed"] == 1


def test_old_samples_are_pruned(pool):
    now = timezone.now()
    with override_settings(SCHEDULER_HEALTH_WINDOW_HOURS=1):
        health.sample_capacity(now=now - timedelta(hours=3))
        health.sample_capacity(now=now)
    assert set(CapacitySample.objects.values_list("at", flat=True)) == {now}
