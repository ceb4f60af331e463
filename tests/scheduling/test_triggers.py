"""Placement on events and one pass per pool at a time, in the test process (tasks inline; the
test settings turn event passes off, these tests turn them on). With a real Celery worker:
tests/scheduling/test_event_passes.py."""

import threading
import time

import pytest
import redis
from django.db import connection
from django.test import override_settings

from config.builders import SYSTEM, build_node, cpu_request, submit_job, submit_jobs
from jobs.choices import JobState
from jobs.models import Job
from leases.choices import LeaseState
from leases.models import Lease
from leases.services import lease_release
from nodes import services as node_services
from pools.reasons import Reason
from scheduling import coalesce, tasks
from scheduling.coalesce import LOCK_SPACE, PoolPasses, run_exclusive
from scheduling.models import PassRecord
from scheduling.passes import scheduling_pass

EVENTS_ON = override_settings(SCHEDULER_EVENT_PASSES=True, SCHEDULER_EVENT_MIN_INTERVAL_S=0.0)


def forget(pool_id: int) -> PoolPasses:
    """The pool's Redis state, cleared (a pool id of another test database's run is another
    prefix; this only guards against a key left by an earlier run of this one)."""
    state = PoolPasses(pool_id)
    coalesce.redis_client().delete(
        state.wanted_key, state.queued_key, state.ended_key, state.lock_key
    )
    return state


@pytest.fixture
def fresh(pool):
    forget(pool.pk)
    return pool


def passes_of(pool) -> int:
    return PassRecord.objects.filter(pool=pool).count()


# --- the triggers ----------------------------------------------------------------------------


def test_a_submit_places_its_job_once_committed(fresh, tenant, django_capture_on_commit_callbacks):
    build_node(fresh, "n1")
    with EVENTS_ON, django_capture_on_commit_callbacks(execute=True):
        job = submit_job(fresh, tenant, "now")
    job.refresh_from_db()
    assert job.state == JobState.LEASED
    assert passes_of(fresh) == 1


def test_jobs_submitted_many_at_once_make_one_pass(
    fresh, tenant, django_capture_on_commit_callbacks
):
    build_node(fresh, "n1", cpu=8000)
    specs = [
        {"tenant": tenant, "name": f"j{i}", "resources": cpu_request(cpu=500)} for i in range(6)
    ]
    with EVENTS_ON, django_capture_on_commit_callbacks(execute=True):
        jobs = submit_jobs(fresh, specs)
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.LEASED).count() == 6
    assert passes_of(fresh) == 1


def test_a_lease_that_ends_places_the_job_waiting_for_its_capacity(
    fresh, tenant, django_capture_on_commit_callbacks
):
    build_node(fresh, "n1", cpu=4000)  # room for one of them
    first = submit_job(fresh, tenant, "first", cpu=3000)
    waiting = submit_job(fresh, tenant, "waiting", cpu=3000)
    scheduling_pass()
    lease = Lease.objects.get(job=first, state__in=[LeaseState.RESERVED])
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    with EVENTS_ON, django_capture_on_commit_callbacks(execute=True):
        lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    waiting.refresh_from_db()
    assert waiting.state == JobState.LEASED


def test_a_node_that_becomes_ready_places_the_waiting_job(
    fresh, tenant, django_capture_on_commit_callbacks
):
    node = build_node(fresh, "n1", ready=False)
    job = submit_job(fresh, tenant, "waiting")
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    with EVENTS_ON, django_capture_on_commit_callbacks(execute=True):
        node = node_services.node_verify(node=node, actor=SYSTEM)
        node_services.node_mark_ready(node=node, actor=SYSTEM)
    job.refresh_from_db()
    assert job.state == JobState.LEASED


def test_no_pass_on_events_when_they_are_off(fresh, tenant, django_capture_on_commit_callbacks):
    build_node(fresh, "n1")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        job = submit_job(fresh, tenant, "later")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and passes_of(fresh) == 0
    assert not [c for c in callbacks if getattr(c, "func", None) is tasks.request_pass]


# --- coalescing ------------------------------------------------------------------------------


def test_requests_before_the_pass_starts_send_one_task_delayed_past_the_interval(
    fresh, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.pool_pass, "apply_async", lambda **kw: sent.append(kw))
    with override_settings(SCHEDULER_EVENT_PASSES=True, SCHEDULER_EVENT_MIN_INTERVAL_S=0.25):
        for _ in range(5):
            tasks.request_pass(fresh.pk)
        assert sent == [{"args": [fresh.pk], "countdown": None}]  # no pass yet: at once
        state = PoolPasses(fresh.pk)
        state.unqueue()  # the task started
        state.mark_ended()  # and its pass ended
        for _ in range(5):
            tasks.request_pass(fresh.pk)
    assert len(sent) == 2
    assert 0.2 < sent[1]["countdown"] <= 0.25  # the trailing edge: after the interval


def test_a_task_that_could_not_be_sent_lets_the_next_request_send(fresh, monkeypatch):
    def broker_down(**kw):
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.pool_pass, "apply_async", broker_down)
    with override_settings(SCHEDULER_EVENT_PASSES=True):
        tasks.request_pass(fresh.pk)  # logged, not raised
    assert PoolPasses(fresh.pk).queue(0.0)  # nothing stands in the way of the next one


# --- one pass per pool at a time -------------------------------------------------------------


def in_thread(target):
    """`target()` on a connection of its own, in a thread, joined."""
    out = []

    def run():
        try:
            out.append(target())
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return out[0] if out else None


def test_requests_while_a_pass_runs_make_exactly_one_more_pass(fresh):
    ran, others = [], []

    def one_pass(n):
        ran.append(n)
        if n == 0:  # three requests while the first pass holds the lock
            for _ in range(3):
                others.append(in_thread(lambda: run_exclusive(fresh.pk, lambda n: 1 / 0)))

    assert run_exclusive(fresh.pk, one_pass) == 2
    assert ran == [0, 1] and others == [0, 0, 0]  # none of theirs ran: the holder ran one more
    assert not PoolPasses(fresh.pk).is_wanted()


def test_a_holder_past_its_budget_hands_the_pool_over(fresh):
    handed = []

    def asked_again_each_time(n):
        PoolPasses(fresh.pk).want()  # a request during every pass

    runs = run_exclusive(fresh.pk, asked_again_each_time, budget_s=0.0, hand_over=handed.append)
    assert runs == 2 and handed == [fresh.pk]  # its pass, one more, then a fresh task
    assert PoolPasses(fresh.pk).is_wanted()  # the request stands for that task


def test_a_paced_pass_starts_the_interval_after_the_previous_one_ended(fresh):
    PoolPasses(fresh.pk).mark_ended()
    began = time.monotonic()
    run_exclusive(fresh.pk, lambda n: None, pace_s=0.3, pace_first=True)
    assert time.monotonic() - began >= 0.25


def hold_advisory_lock(pool_id, held: threading.Event, release: threading.Event):
    def run():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_SPACE, pool_id])
                held.set()
                release.wait(30)
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_SPACE, pool_id])
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert held.wait(10)
    return thread


@pytest.mark.django_db(transaction=True)
def test_beats_pass_leaves_a_pool_whose_lock_another_holds_to_it(pool, tenant):
    forget(pool.pk)
    build_node(pool, "n1")
    job = submit_job(pool, tenant, "waits-for-the-holder")
    held, release = threading.Event(), threading.Event()
    holder = hold_advisory_lock(pool.pk, held, release)
    try:
        result = scheduling_pass()
        assert result.placed == [] and passes_of(pool) == 0
        assert PoolPasses(pool.pk).is_wanted()  # the holder is asked for one more
    finally:
        release.set()
        holder.join(10)
    assert scheduling_pass().placed == [job.pk]


def test_off_postgresql_the_lock_is_a_redis_key(fresh, monkeypatch):
    monkeypatch.setattr(coalesce, "on_postgresql", lambda: False)
    state = PoolPasses(fresh.pk)
    coalesce.redis_client().set(state.lock_key, "another-process", px=10_000)
    assert run_exclusive(fresh.pk, lambda n: 1 / 0) == 0
    assert state.is_wanted()
    coalesce.redis_client().delete(state.lock_key)
    assert run_exclusive(fresh.pk, lambda n: None) == 1
    assert not coalesce.redis_client().exists(state.lock_key)  # released


def test_without_redis_the_holder_still_runs_its_one_pass(fresh, monkeypatch):
    def down():
        raise redis.ConnectionError("no Redis")

    monkeypatch.setattr(coalesce, "redis_client", down)
    ran = []
    assert run_exclusive(fresh.pk, ran.append) == 1 and ran == [0]


def test_the_redis_lock_outlives_a_dead_holder_no_longer_than_the_pass_may_run():
    assert coalesce.LOCK_TTL_S == tasks.PASS_TIME_LIMIT_S
