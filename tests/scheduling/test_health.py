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
    assert series[-1]["at"] <= now < series[-1]["at"] + timedelta(minutes=1)
    last = series[-1]
    assert last["passes"] == 2 and last["placed"] == 6 and last["per_pass"] == 3
    assert last["max_s"] == pytest.approx(0.6) and last["mean_s"] == pytest.approx(0.4)
    assert series[-6]["errors"] == 1 and series[-6]["max_s"] == pytest.approx(1.5)
    assert series[-2]["passes"] == 0  # a quiet minute is a point too
    assert len(health.pass_series(pool, 24, now=now)) == 96  # the first pages' ?hours=24
    day = health.pass_series(pool, "24h", now=now)
    assert sum(p["passes"] for p in day) == 3
    assert max(p["max_s"] for p in day) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("key", "points", "step_minutes"),
    [("15m", 15, 1), ("1h", 60, 1), ("6h", 72, 5), ("24h", 96, 15), ("7d", 168, 60)],
)
def test_each_range_has_its_points_and_step(pool, key, points, step_minutes):
    now = timezone.now()
    slots = health.slots(key, now)
    assert len(slots) == points == health.RANGES[key].points
    assert slots[1] - slots[0] == timedelta(minutes=step_minutes)
    assert slots[-1] <= now < slots[-1] + timedelta(minutes=step_minutes)
    assert len(health.pass_series(pool, key, now=now)) == points
    assert len(health.expiry_series(pool, key, now=now)) == points


def test_six_hours_merge_minutes_into_five_minute_points(pool):
    now = timezone.now()
    slot = health.slots("6h", now)[-2]  # a whole five minutes, before the current one
    for minute, duration in ((0, 0.1), (1, 0.3), (4, 0.8)):
        health.record_pass(
            pool_id=pool.pk, started_at=slot + timedelta(minutes=minute), duration_s=duration
        )
    point = health.pass_series(pool, "6h", now=now)[-2]
    assert point["passes"] == 3 and point["max_s"] == pytest.approx(0.8)
    assert point["mean_s"] == pytest.approx(0.4)


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
    points = cpu["points"]
    assert len(points) == 60 and points[-1]["requested"] is None  # no sample this minute
    assert points[-2]["schedulable"] == 4000


def test_utilisation_is_a_percent_of_schedulable_capacity(pool):
    """One denominator: a node that is not schedulable (here unreachable) is left out of it,
    and what it holds is not requested of the schedulable capacity."""
    from nodes.choices import Reachability
    from nodes.models import Node

    build_node(pool, "n1", cpu=4000, memory=8192)
    gone = build_node(pool, "n2", cpu=4000, memory=8192)
    Node.objects.filter(name="n1").update(cpu_millicores_reserved=1000)
    Node.objects.filter(pk=gone.pk).update(
        reachability=Reachability.UNREACHABLE, cpu_millicores_reserved=4000
    )
    now = timezone.now()
    health.sample_capacity(now=now - timedelta(minutes=1))
    cpu = health.utilisation(pool, "15m", now=now)["dimensions"]["cpu_millicores"]
    assert cpu["requested"] == [25.0]  # 1000 of n1's 4000, not 5000 of 8000
    assert cpu["points"][-2]["schedulable"] == 4000


def test_a_sample_from_before_schedulable_reads_allocatable():
    old = {"allocatable": {"cpu_millicores": 1000}, "reserved": {"cpu_millicores": 250}}
    assert health.sample_percents(old, "cpu_millicores")[:2] == (25.0, 0.0)
    assert health.sample_percents({"schedulable": {}}, "cpu_millicores") is None


def test_rollups_fold_each_hour_and_the_seven_days_read_them(pool):
    from scheduling.models import HealthRollup

    node = build_node(pool, "n1", cpu=4000, memory=8192)
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    type(node).objects.filter(pk=node.pk).update(cpu_millicores_reserved=1000)
    health.sample_capacity(now=hour + timedelta(minutes=10))
    type(node).objects.filter(pk=node.pk).update(cpu_millicores_reserved=3000)
    health.sample_capacity(now=hour + timedelta(minutes=20))
    for seconds in (0.2, 0.6):
        health.record_pass(
            pool_id=pool.pk, started_at=hour + timedelta(minutes=5), duration_s=seconds, placed=2
        )
    assert health.roll_up(now=now) >= 3  # two hours ago, the last hour, this one
    rollup = HealthRollup.objects.get(pool=pool, hour=hour)
    cpu = rollup.capacity["cpu_millicores"]
    assert rollup.samples == 2 and cpu["requested"] == 50.0 and cpu["requested_peak"] == 75.0
    assert rollup.passes["passes"] == 2 and rollup.passes["placed"] == 4
    assert rollup.passes["max_s"] == pytest.approx(0.6)
    # again: the hours are re-done, never doubled
    health.roll_up(now=now)
    assert HealthRollup.objects.filter(pool=pool, hour=hour).count() == 1

    week = health.pass_series(pool, "7d", now=now)
    assert len(week) == 168
    point = next(p for p in week if p["at"] == hour)
    assert point["passes"] == 2 and point["mean_s"] == pytest.approx(0.4)
    use = health.utilisation(pool, "7d", now=now)["dimensions"]["cpu_millicores"]
    assert use["requested_peak"] == 75.0 and use["requested"][0] == 50.0


def test_rollups_older_than_thirty_days_are_pruned(pool):
    from scheduling.models import HealthRollup

    now = timezone.now()
    HealthRollup.objects.create(
        pool=pool, hour=now - timedelta(days=31), updated_at=now - timedelta(days=31)
    )
    kept = HealthRollup.objects.create(
        pool=pool, hour=now - timedelta(days=29), updated_at=now - timedelta(days=29)
    )
    health.roll_up(now=now)
    assert set(HealthRollup.objects.filter(hour__lt=now - timedelta(days=2))) == {kept}


def test_one_bad_pool_hour_never_stops_the_others(pool, monkeypatch):
    from scheduling.models import HealthRollup

    other = build_pool("hp3")
    real = health._roll_up_hour

    def flaky(p, hour, now):
        if p.pk == pool.pk:
            raise ValueError("corrupt sample")
        return real(p, hour, now)

    monkeypatch.setattr(health, "_roll_up_hour", flaky)
    now = timezone.now()
    health.roll_up(now=now)
    failed = HealthRollup.objects.filter(pool=pool)
    assert failed.exists() and all("corrupt sample" in r.error for r in failed)
    assert HealthRollup.objects.filter(pool=other, error="").count() == failed.count()


def test_node_usage_from_the_samples(pool):
    node = build_node(pool, "n1", cpu=4000, memory=8192)
    now = timezone.now()
    type(node).objects.filter(pk=node.pk).update(cpu_millicores_reserved=2000)
    health.sample_capacity(now=now - timedelta(minutes=1))
    usage = health.node_usage(node, "15m", now=now)
    cpu = usage["cpu_millicores"]
    assert cpu["allocatable"] == 4000 and cpu["points"][-2]["reserved"] == 2000
    assert cpu["points"][-1]["reserved"] is None
    with pytest.raises(ValueError):
        health.node_usage(node, "7d", now=now)


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
