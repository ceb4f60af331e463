"""Cancelling a job never yields a running one: real races on PostgreSQL (issue 12).

Threads, each with its own connection, race the tenant's cancel against the scheduling pass
placing the job, and against the agent reporting `starting` under the job's lease. Whoever
wins, the job ends cancelled, its lease (if it got one) is released exactly once, the node's
ledger is back at zero, the events tell a possible story, and the node's assignments do not
list the job. Each race runs twice over: many free rounds with a jittered start, and the two
orders forced, one side holding the job's row lock while the other is seen to wait on it (or,
for the pass's SKIP LOCKED, to go past it).
"""

import threading
import time

import pytest
from django.db import connection

from config.builders import build_node, build_person, build_pool, build_tenant, submit_job
from jobs import lifecycle, services
from jobs.assignments import node_assignments
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.models import JobEvent
from jobs.services import job_cancel
from leases.choices import HOLDING, LeaseState
from leases.models import Lease, LeaseEvent
from leases.selectors import ledger_problems
from leases.services import ledger
from pools.actors import Actor
from pools.choices import TokenScope
from pools.statemachine import TransitionRefused
from scheduling.passes import scheduling_pass
from tests.clients import client_for

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 30
# the cancel's head start is jittered over about the time a pass takes to reach the job
JITTER_S = [i * 0.0015 for i in range(8)]
Q, L, ST, C = JobState.QUEUED, JobState.LEASED, JobState.STARTING, JobState.CANCELLED


@pytest.fixture
def world(db):
    pool = build_pool("race", exact_capacity=True)
    node = build_node(pool, "n1", cpu=8000, memory=16384)
    tenant = build_tenant("racer", name="Racer")
    person = build_person("rita", tenant=tenant)
    return pool, node, tenant, person


def race(*sides, start=None):
    """Run each side in its own thread behind a barrier, each with its own connection; return
    what each side returned (or the exception it raised)."""
    barrier = threading.Barrier(len(sides))
    results = [None] * len(sides)

    def wrapped(i):
        try:
            barrier.wait()
            results[i] = sides[i]()
        except Exception as exc:  # inspected by the caller: a refusal may be the right answer
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(len(sides))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a side of the race hung"
    return results


def wait_until_someone_waits_on_a_lock(timeout=5.0):
    """Poll (from the lock holder's own connection) until another backend of this database
    waits on a lock: the other side has reached the row the holder locked."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # the view is cached per xact
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.002)
    raise AssertionError("the other side never waited on the job's row lock")


def hold_after(real, then):
    """`real`, then `then()` before returning: still inside the caller's transaction, so the
    job's row lock is held meanwhile."""

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        then()
        return result

    return wrapper


def states(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("to_state", flat=True))


def assert_cancelled_cleanly(job, pool, node) -> list[str]:
    """The invariants every round ends in, whoever won; returns the job's state path. A job
    cancelled after it started holds its lease `stopping` (listed so to the node, its capacity
    held) until the agent confirms the stop, which this then does."""
    job.refresh_from_db()
    assert job.state == C
    path = states(job)
    assert path[-1] == C and path.count(C) == 1  # nothing happened after the cancel
    assert path in ([Q, C], [Q, L, C], [Q, L, ST, C]), path
    leases = list(Lease.objects.filter(job=job))
    assert len(leases) == (0 if path == [Q, C] else 1)
    if ST in path:
        (lease,) = leases
        assert lease.state == LeaseState.STOPPING
        assert ledger_problems(pool) == []
        node.refresh_from_db()
        assert node.cpu_millicores_reserved == lease.cpu_millicores  # still held
        listed = [a for a in node_assignments(node=node) if a["job"] == job.pk]
        assert [(a["lease"], a["state"]) for a in listed] == [(lease.pk, "stopping")]
        job_report(
            job=job,
            node=node,
            fencing_token=lease.fencing_token,
            step="stopped",
            actor=Actor.for_node(node),
        )
        lease.refresh_from_db()
    for lease in leases:
        lease.refresh_from_db()
        assert lease.state == LeaseState.RELEASED
        endings = LeaseEvent.objects.filter(lease=lease, to_state=LeaseState.RELEASED)
        assert endings.count() == 1  # the capacity came back exactly once
    assert not Lease.objects.filter(job=job, state__in=HOLDING).exists()
    assert ledger_problems(pool) == []
    node.refresh_from_db()
    assert (node.cpu_millicores_reserved, node.memory_mib_reserved) == (0, 0)
    assert all(a["job"] != job.pk for a in node_assignments(node=node))
    return path


# --- the tenant's cancel against the scheduling pass placing the job ----------------------


def test_cancel_against_the_pass_always_wins(world):
    pool, node, tenant, person = world
    actor = Actor.for_user(person)
    seen = {"cancelled queued": 0, "cancelled leased": 0}
    for round_ in range(ROUNDS):
        job = submit_job(pool, tenant, actor=actor)
        delay = JITTER_S[round_ % len(JITTER_S)]

        def cancel(job=job, delay=delay):
            time.sleep(delay)
            return job_cancel(job=job, actor=actor)

        placing, cancelled = race(lambda: scheduling_pass(pool_id=pool.pk), cancel)
        assert not isinstance(placing, Exception), placing
        assert not isinstance(cancelled, Exception), cancelled  # a cancel is never refused
        path = assert_cancelled_cleanly(job, pool, node)
        assert (job.pk in placing.placed) == (L in path)  # the pass's word matches the row
        seen["cancelled leased" if L in path else "cancelled queued"] += 1
    assert sum(seen.values()) == ROUNDS


def test_cancel_waits_for_the_pass_that_holds_the_job_then_releases_its_lease(world):
    """The pass has locked the job and reserved its lease; the cancel arrives, waits on the
    row lock, and after the pass commits cancels the leased job and releases the lease."""
    pool, node, tenant, person = world
    job = submit_job(pool, tenant)
    reserved = threading.Event()

    def signal_and_wait(rows):
        reserved.set()
        wait_until_someone_waits_on_a_lock()

    def cancel():
        assert reserved.wait(10)
        return job_cancel(job=job, actor=Actor.for_user(person))

    # the pass holds the job's row lock while the ledger writes the leases of its plan
    with ledger.race_hook(ledger.AFTER_INSERTS, signal_and_wait):
        placing, cancelled = race(lambda: scheduling_pass(pool_id=pool.pk), cancel)
    assert not isinstance(cancelled, Exception), cancelled
    assert placing.placed == [job.pk]
    assert assert_cancelled_cleanly(job, pool, node) == [Q, L, C]


def test_pass_skips_the_job_a_cancel_holds_and_never_places_it(world, monkeypatch):
    """The cancel holds the job's row lock: the pass goes past it (SKIP LOCKED) without
    waiting, and once the cancel commits no pass places the job."""
    pool, node, tenant, person = world
    job = submit_job(pool, tenant)
    locked, passed = threading.Event(), threading.Event()

    def signal_and_wait():
        locked.set()
        assert passed.wait(10), "the pass waited on the cancel's row lock"

    monkeypatch.setattr(
        services, "job_transition", hold_after(services.job_transition, signal_and_wait)
    )

    def place():
        assert locked.wait(10)
        result = scheduling_pass(pool_id=pool.pk)
        passed.set()
        return result

    cancelled, placing = race(lambda: job_cancel(job=job, actor=Actor.for_user(person)), place)
    assert not isinstance(cancelled, Exception), cancelled
    assert job.pk not in placing.placed and job.pk not in placing.pending
    assert scheduling_pass(pool_id=pool.pk).placed == []
    assert assert_cancelled_cleanly(job, pool, node) == [Q, C]


# --- the tenant's cancel against the agent reporting `starting` ---------------------------


def place(job, pool):
    assert job.pk in scheduling_pass(pool_id=pool.pk).placed
    return job.leases.get(state=LeaseState.RESERVED)


def report_starting(job, node, lease):
    return job_report(
        job=job,
        node=node,
        fencing_token=lease.fencing_token,  # as the agent API passes it
        step="starting",
        actor=Actor.for_node(node),
    )


def assert_refused_as_stale(outcome):
    """A report that lost to the cancel: the API's 409 (its lease has ended), never a state
    change."""
    assert isinstance(outcome, TransitionRefused), outcome
    assert outcome.code == "lease_ended"


def test_cancel_against_the_agent_starting_the_job(world):
    pool, node, tenant, person = world
    actor = Actor.for_user(person)
    for round_ in range(ROUNDS):
        job = submit_job(pool, tenant, actor=actor)
        lease = place(job, pool)
        # the report is the quicker side: every other round it is the one held back
        delay = JITTER_S[(round_ // 2) % len(JITTER_S)] / 3
        cancel_delay, report_delay = (delay, 0) if round_ % 2 else (0, delay)

        def cancel(job=job, delay=cancel_delay):
            time.sleep(delay)
            return job_cancel(job=job, actor=actor)

        def start(job=job, lease=lease, delay=report_delay):
            time.sleep(delay)
            return report_starting(job, node, lease)

        reported, cancelled = race(start, cancel)
        assert not isinstance(cancelled, Exception), cancelled
        path = assert_cancelled_cleanly(job, pool, node)
        if path == [Q, L, ST, C]:  # the report came first: it started, then was cancelled
            assert not isinstance(reported, Exception), reported
            assert LeaseEvent.objects.filter(lease=lease, to_state=LeaseState.COMMITTED).exists()
        else:  # the cancel came first: the report was refused and changed nothing
            assert path == [Q, L, C]
            assert_refused_as_stale(reported)
            assert not LeaseEvent.objects.filter(
                lease=lease, to_state=LeaseState.COMMITTED
            ).exists()


def test_cancel_waits_for_the_report_that_holds_the_job(world, monkeypatch):
    pool, node, tenant, person = world
    job = submit_job(pool, tenant)
    lease = place(job, pool)
    committed = threading.Event()

    def signal_and_wait():
        committed.set()
        wait_until_someone_waits_on_a_lock()

    monkeypatch.setattr(
        lifecycle, "lease_commit", hold_after(lifecycle.lease_commit, signal_and_wait)
    )

    def cancel():
        assert committed.wait(10)
        return job_cancel(job=job, actor=Actor.for_user(person))

    reported, cancelled = race(lambda: report_starting(job, node, lease), cancel)
    assert not isinstance(reported, Exception), reported
    assert reported.state == ST
    assert not isinstance(cancelled, Exception), cancelled
    assert assert_cancelled_cleanly(job, pool, node) == [Q, L, ST, C]


def test_report_waits_for_the_cancel_that_holds_the_job_then_is_refused(world, monkeypatch):
    pool, node, tenant, person = world
    job = submit_job(pool, tenant)
    lease = place(job, pool)
    locked = threading.Event()

    def signal_and_wait():
        locked.set()
        wait_until_someone_waits_on_a_lock()

    monkeypatch.setattr(
        services, "job_transition", hold_after(services.job_transition, signal_and_wait)
    )

    def report():
        assert locked.wait(10)
        return report_starting(job, node, lease)

    cancelled, reported = race(lambda: job_cancel(job=job, actor=Actor.for_user(person)), report)
    assert not isinstance(cancelled, Exception), cancelled
    assert_refused_as_stale(reported)
    assert assert_cancelled_cleanly(job, pool, node) == [Q, L, C]


# --- through the HTTP API: POST /jobs/{id}/cancel against a live pass ----------------------


def test_api_cancel_against_a_live_pass(world):
    pool, node, tenant, person = world
    tenant_api = client_for(person, (TokenScope.READ, TokenScope.WRITE))
    agent_api = client_for(node=node)
    for round_ in range(4):
        job = submit_job(pool, tenant)

        def cancel(job=job, delay=JITTER_S[round_ * 2]):
            time.sleep(delay)
            return tenant_api.post(f"/api/v1/jobs/{job.pk}/cancel")

        _, response = race(lambda: scheduling_pass(pool_id=pool.pk), cancel)
        assert response.status_code == 200, response.content
        assert response.json()["state"] == C
        path = assert_cancelled_cleanly(job, pool, node)
        assert agent_api.get("/api/v1/agent/assignments").json() == []
        if L in path:  # the agent got no chance to start it: its report is refused
            lease = job.leases.get()
            body = {"fencing_token": str(lease.fencing_token), "step": "starting"}
            answer = agent_api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
            assert answer.status_code == 409
            assert answer.json()["code"] == "lease_ended"
