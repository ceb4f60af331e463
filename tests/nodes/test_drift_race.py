"""A node's inventory shrinking under its jobs, raced on PostgreSQL against the job's own
report or cancel on the same node (docs/observability.md "Traces", `capacity_vanished`).

Everywhere else the locks are taken job → lease → node (a report or a cancel locks the job, its
lease, then the node's ledger row). The reconciliation used to hold the node's row lock while
ending the jobs that lost their capacity (job, then lease): the reverse order, a deadlock
against a report of the same job. Now it caps the allocatable at what the leases hold under the
node's lock, releases it, then ends each job in the usual order, lowering the allocatable in
the same commit. Threads, each with its own connection: no deadlock, and the node's allocatable
is never below what its holding leases reserve (the check constraints would refuse the commit;
the ledger agrees with the leases after)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from config.builders import SYSTEM, build_node, build_pool
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.models import Job
from jobs.services import job_cancel
from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import ledger_problems
from nodes import services
from nodes.models import Node
from pools.actors import Actor
from pools.reasons import Reason

pytestmark = pytest.mark.django_db(transaction=True)

CPU, JOB_CPU, SHRUNK_CPU = 8000, 3000, 5000  # two jobs hold 6000; the node then has 5000
ROUNDS = 8
JITTER_S = [i * 0.002 for i in range(4)]


@pytest.fixture
def race_pool(db):
    return build_pool("drift-race", exact_capacity=True)  # allocatable == raw


def shrink(node) -> None:
    """The agent reports less CPU than the node's two jobs hold."""
    inventory = dict(node.inventory, cpu_millicores=SHRUNK_CPU)
    services.node_inventory_report(node=node, inventory=inventory)


def two_jobs(race_pool, make_job, index: int, victim_state: str):
    """A node with an older running job and a newer one in `victim_state`: the newer one is
    the one whose capacity vanishes (the newest first, jobs/receivers.py)."""
    node = build_node(race_pool, f"race-{index}", cpu=CPU, memory=16384)
    older, _ = make_job(node, state=JobState.RUNNING, cpu=JOB_CPU, memory=1024)
    victim, lease = make_job(node, state=victim_state, cpu=JOB_CPU, memory=1024)
    shrink(node)
    return node, older, victim, lease


def report_succeeded(node, job, lease):
    return job_report(
        job=job,
        node=node,
        fencing_token=lease.fencing_token,
        step="succeeded",
        exit_code=0,
        actor=Actor.for_node(node),
    )


def cancel(node, job, lease):
    return job_cancel(job=job, actor=SYSTEM)


def race(*sides):
    barrier = threading.Barrier(len(sides))
    results = [None] * len(sides)

    def wrapped(i):
        try:
            barrier.wait()
            results[i] = sides[i]()
        except Exception as exc:  # a deadlock (OperationalError) among them: the failure
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(len(sides))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a side of the race hung"
    return results


def wait_until_someone_waits_on_a_lock(timeout=5.0) -> None:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.002)
    raise AssertionError("the reconciliation never waited on the job's row lock")


def assert_consistent(node, older, victim) -> None:
    """Whoever won: the victim ended once (by its own report or cancel, or by
    capacity_vanished), the older job runs on, the ledger agrees with the holding leases, and
    the node's allocatable is what it reported, never below what those leases reserve."""
    node.refresh_from_db()
    older.refresh_from_db()
    victim.refresh_from_db()
    assert older.state == JobState.RUNNING
    assert victim.state in (JobState.SUCCEEDED, JobState.CANCELLED, JobState.FAILED)
    assert victim.events.filter(to_state=victim.state).count() == 1
    held = sum(
        Lease.objects.filter(node=node, state__in=HOLDING).values_list("cpu_millicores", flat=True)
    )
    assert node.cpu_millicores_reserved == held == JOB_CPU
    assert node.cpu_millicores_allocatable == SHRUNK_CPU >= node.cpu_millicores_reserved
    assert ledger_problems(node.pool) == []


@pytest.mark.parametrize(
    ("victim_state", "act"),
    [(JobState.RUNNING, report_succeeded), (JobState.LEASED, cancel)],
    ids=["report", "cancel"],
)
def test_the_jobs_own_end_holding_its_row_lock_does_not_deadlock_the_shrink(
    race_pool, make_job, victim_state, act
):
    """The forced order: the job's report (or cancel) has locked the job's row when the
    reconciliation starts; it goes on, to the lease and the node, only once the reconciliation
    waits on that lock. Holding the node's row lock there was a deadlock; now the shrink has
    committed and released the node before it reaches for the job."""
    node, older, victim, lease = two_jobs(race_pool, make_job, 0, victim_state)
    locked = threading.Event()

    def the_jobs_end():
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=victim.pk)  # the report's first lock
            locked.set()
            wait_until_someone_waits_on_a_lock()
            return act(node, victim, lease)

    def reconcile():
        assert locked.wait(10)
        return services.node_inventory_reconcile(node=node, actor=SYSTEM)

    ended, diffs = race(the_jobs_end, reconcile)
    assert not isinstance(ended, Exception), ended
    assert not isinstance(diffs, Exception), diffs
    assert [d["field"] for d in diffs] == ["cpu_millicores"]
    assert_consistent(node, older, victim)
    # the job's own end came first: capacity_vanished found it ended and left it alone
    assert not victim.events.filter(reason=Reason.CAPACITY_VANISHED).exists()


@pytest.mark.parametrize(
    ("victim_state", "act"),
    [(JobState.RUNNING, report_succeeded), (JobState.LEASED, cancel)],
    ids=["report", "cancel"],
)
def test_the_shrink_raced_against_the_jobs_end_keeps_the_ledger(
    race_pool, make_job, victim_state, act
):
    """Free rounds with a jittered start: either side may win; never a deadlock, never an
    allocatable below the reserved (an IntegrityError from the check constraints), the ledger
    right after, and the victim ended exactly once."""
    winners = set()
    for round_ in range(ROUNDS):
        node, older, victim, lease = two_jobs(race_pool, make_job, round_, victim_state)
        delay = JITTER_S[round_ % len(JITTER_S)]

        def the_jobs_end(node=node, victim=victim, lease=lease, delay=delay):
            time.sleep(delay)
            return act(node, victim, lease)

        def reconcile(node=node):
            return services.node_inventory_reconcile(node=node, actor=SYSTEM)

        ended, diffs = race(the_jobs_end, reconcile)
        assert not isinstance(diffs, Exception), diffs
        assert not isinstance(ended, OperationalError | IntegrityError), ended
        assert_consistent(node, older, victim)
        vanished = victim.events.filter(reason=Reason.CAPACITY_VANISHED).exists()
        winners.add("capacity_vanished" if vanished else "the job's end")
        if act is report_succeeded:
            # capacity_vanished failed the job first: its report is refused (409), else the
            # report ended it and capacity_vanished left it alone
            assert isinstance(ended, Exception) == vanished == (victim.state == JobState.FAILED)
        else:
            # placed, not started: capacity_vanished puts it back in the queue, where the cancel
            # still ends it; or the cancel came first
            assert not isinstance(ended, Exception), ended
            assert victim.state == JobState.CANCELLED
    assert winners  # which side wins depends on the machine's timing


def test_the_sweep_ends_the_victims_after_its_row_locks_are_released(race_pool, make_job):
    """The beat's sweep locks each node it reconciles: the victims end after it committed."""
    node, older, victim, _ = two_jobs(race_pool, make_job, 0, JobState.RUNNING)
    seen = {}

    def check_no_node_lock(**_):
        seen["in_transaction"] = connection.in_atomic_block  # the sweep's has committed

    from nodes.signals import capacity_vanished

    capacity_vanished.connect(check_no_node_lock, dispatch_uid="test-no-node-lock")
    try:
        results = services.inventory_reconcile_sweep()
    finally:
        capacity_vanished.disconnect(dispatch_uid="test-no-node-lock")
    assert list(results) == [node.pk]
    assert seen == {"in_transaction": False}
    victim.refresh_from_db()
    assert victim.state == JobState.FAILED
    assert victim.events.latest("id").reason == Reason.CAPACITY_VANISHED
    assert_consistent(node, older, victim)
    assert Node.objects.get(pk=node.pk).cpu_millicores_allocatable == SHRUNK_CPU
