"""The thin Celery tasks: each sweep takes `now`, and a second run finds nothing to do."""

from datetime import timedelta

from django.utils import timezone

from config.builders import SYSTEM, cpu_request
from config.celery import app
from leases import services, tasks
from leases.choices import LeaseState
from leases.selectors import ledger_problems

MIN = timedelta(minutes=1)


def reserve(pool, tenant, now, **kw):
    return services.lease_reserve(
        pool=pool, tenant=tenant, request=cpu_request(), actor=SYSTEM, now=now, **kw
    )


def test_expire_task_takes_now_and_is_idempotent(lpool, ltenant, lnode):
    now = timezone.now()
    lease = reserve(lpool, ltenant, now, duration=MIN)
    assert tasks.expire_leases.delay(now=(now + 30 * 1e-3 * MIN).isoformat()).get() == 0
    assert tasks.expire_leases.delay(now=(now + 2 * MIN).isoformat()).get() == 1
    assert tasks.expire_leases(now=now + 2 * MIN) == 0
    lease.refresh_from_db()
    assert lease.state == LeaseState.EXPIRED
    assert ledger_problems(lpool) == []


def test_uncertain_deadline_task(lpool, ltenant, lnode):
    now = timezone.now()
    lease = reserve(lpool, ltenant, now, duration=60 * MIN)
    services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=now)
    services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=now)
    assert tasks.expire_uncertain(now=now + 5 * MIN) == 0  # default deadline: 10 minutes
    assert tasks.expire_uncertain(now=now + 5 * MIN, deadline_s=60) == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.EXPIRED
    assert ledger_problems(lpool) == []


def test_reservation_sweep_task(lpool, ltenant, lnode):
    now = timezone.now()
    window = services.Window(now + 10 * MIN, now + 20 * MIN, MIN)
    lease = reserve(lpool, ltenant, now, duration=MIN, window=window)
    assert tasks.release_unclaimed_reservations(now=now + 10 * MIN) == 0
    assert tasks.release_unclaimed_reservations(now=(now + 12 * MIN).isoformat()) == 1
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    assert ledger_problems(lpool) == []


def test_beat_schedule_names_registered_tasks():
    app.loader.import_default_modules()  # the apps' tasks modules, as a worker imports them
    names = {entry["task"] for entry in app.conf.beat_schedule.values()}
    for task in (
        "leases.expire_leases",
        "leases.expire_uncertain",
        "leases.release_unclaimed_reservations",
        "scheduling.pass",
        "scheduling.requeue_stranded_jobs",
    ):
        assert task in names
        assert task in app.tasks


def test_a_lease_never_committed_expires_after_the_commit_window_and_cannot_renew(
    lpool, ltenant, lnode
):
    """An abuse test reserved the whole pool for a week and renewed it while still reserved:
    every other tenant's queue stalled behind it. Only a committed lease holds past the pool's
    commit window (5 minutes by default)."""
    from pools.reasons import Reason
    from pools.statemachine import TransitionRefused

    now = timezone.now()
    week = timedelta(days=7)
    idle = reserve(lpool, ltenant, now, duration=week)
    used = reserve(lpool, ltenant, now, duration=week)
    services.lease_commit(lease=used, fencing_token=used.fencing_token, actor=SYSTEM, now=now)
    try:
        services.lease_renew(
            lease=idle, fencing_token=idle.fencing_token, actor=SYSTEM, duration=week, now=now
        )
    except TransitionRefused as refusal:
        assert refusal.code == "not_committed"
    else:
        raise AssertionError("an uncommitted lease renewed")
    assert tasks.expire_leases(now=now + 4 * MIN) == 0
    assert tasks.expire_leases(now=now + 6 * MIN) == 1
    idle.refresh_from_db()
    used.refresh_from_db()
    assert idle.state == LeaseState.EXPIRED and used.state == LeaseState.COMMITTED
    assert idle.events.last().reason == Reason.EXPIRED_UNCOMMITTED
    assert ledger_problems(lpool) == []
