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
