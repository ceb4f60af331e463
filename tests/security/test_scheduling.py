"""D1: the scheduling pass and the lease sweeps never stop on one bad row; one tenant's quota-
blocked backlog cannot starve another tenant's job; unreachable nodes get no new leases.

Bad rows are real: corrupt JSON written straight to the job row (legacy data the API no longer
accepts), a lease whose size no longer matches its node's ledger, or a PostgreSQL trigger that
refuses one row (a real database error, raised where the service writes).
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, cpu_request, submit_job
from jobs.choices import JobState
from jobs.models import Job
from leases import services, snapshot
from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent
from leases.selectors import ledger_problems
from leases.services import ledger
from leases.tasks import expire_leases as expire_leases_task
from nodes.choices import Reachability
from nodes.services import node_mark_unreachable
from placement import place
from pools.models import PriorityClass, Quota
from pools.reasons import Reason
from scheduling.passes import requeue_jobs_without_lease, scheduling_pass
from scheduling.tasks import scheduling_pass as scheduling_pass_task

MIN = timedelta(minutes=1)


@pytest.fixture
def pool(db):
    return build_pool("sec", exact_capacity=True)


def refuse_rows(table: str, when: str, *, errcode: str = "P0001", on: str = "INSERT") -> None:
    """A trigger that makes PostgreSQL refuse the rows matching `when` (NEW.…): a real error
    from the database for one row. DDL is transactional: the test's rollback removes it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_bad_row() RETURNS trigger AS $$ BEGIN "
            f"IF {when} THEN RAISE EXCEPTION 'bad row refused' USING ERRCODE = '{errcode}'; "
            "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER refuse_bad_row BEFORE {on} ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION refuse_bad_row()"
        )


# --- 1. one bad job never stops the pass -----------------------------------------------------


@pytest.mark.parametrize(
    "corrupt",
    [
        {"regions": 5},
        {"regions": True},
        {"gpu_models": 5},
        {"gpu_sharing_class": "exclusive", "gpu_count": 1, "gpu_models": [["A100"]]},
    ],
)
def test_a_corrupt_job_fails_alone_and_the_pass_places_the_others(pool, ltenant, ltenant2, corrupt):
    build_node(pool, "n1", cpu=4000, memory=8192, gpus=[{}])
    urgent = PriorityClass.objects.create(name="urgent", value=10_000)
    bad = submit_job(pool, ltenant, "bad", priority=urgent)  # first in every pass
    Job.objects.filter(pk=bad.pk).update(resources={**bad.resources, **corrupt})
    good = submit_job(pool, ltenant2, "good")

    result = scheduling_pass_task.delay().get()  # the Celery task, as beat runs it

    assert result["placed"] == [good.pk]
    assert result["pending"] == {bad.pk: "scheduling_error"}
    good.refresh_from_db()
    assert good.state == JobState.LEASED
    assert Lease.objects.get(job=good).state == LeaseState.RESERVED
    bad.refresh_from_db()
    assert bad.state == JobState.FAILED
    event = bad.events.latest("id")
    assert (event.from_state, event.to_state, event.reason) == (
        "queued",
        "failed",
        "scheduling_error",
    )
    assert "TypeError" in event.message
    assert bad.pending_reason["code"] == "scheduling_error"
    assert not Lease.objects.filter(job=bad).exists()
    assert scheduling_pass().placed == []  # no longer blocking: nothing left to retry
    assert ledger_problems(pool) == []


def test_a_database_error_on_one_job_is_rolled_back_and_the_pass_goes_on(pool, ltenant, ltenant2):
    build_node(pool, "n1", cpu=4000, memory=8192)
    bad = submit_job(pool, ltenant, "bad")
    good = submit_job(pool, ltenant2, "good")
    refuse_rows("scheduling_lease", f"NEW.job_id = {bad.pk}")

    result = scheduling_pass()

    # the failed INSERT aborted only the bad job's savepoint: the connection still works
    assert result.placed == [good.pk]
    bad.refresh_from_db()
    assert bad.state == JobState.FAILED
    assert bad.events.latest("id").reason == Reason.SCHEDULING_ERROR
    assert "bad row refused" in bad.events.latest("id").message
    assert ledger_problems(pool) == []  # the bad job's guarded UPDATE was undone with it


def test_a_transient_database_error_leaves_the_job_queued_with_the_reason(pool, ltenant, ltenant2):
    build_node(pool, "n1", cpu=4000, memory=8192)
    busy = submit_job(pool, ltenant, "busy")
    good = submit_job(pool, ltenant2, "good")
    refuse_rows("scheduling_lease", f"NEW.job_id = {busy.pk}", errcode="55P03")  # lock n/a

    assert scheduling_pass().placed == [good.pk]
    busy.refresh_from_db()
    assert busy.state == JobState.QUEUED  # retried by the next pass, not failed
    assert busy.pending_reason["code"] == "scheduling_error"
    assert "bad row refused" in busy.pending_reason["message"]


# --- 2. one bad row never stops a sweep ------------------------------------------------------


def reserve(pool, tenant, now, **kw):
    kw.setdefault("duration", MIN)
    return services.lease_reserve(
        pool=pool, tenant=tenant, request=cpu_request(), actor=SYSTEM, now=now, **kw
    )


def corrupt_ledger(lease):
    """The lease claims more than its node's ledger holds: returning it must fail."""
    Lease.objects.filter(pk=lease.pk).update(cpu_millicores=F("cpu_millicores") + 100_000)


def sweep_failures(lease):
    return list(lease.events.filter(reason=Reason.SWEEP_FAILED))


def test_expiry_sweep_skips_a_corrupt_lease_records_it_and_expires_the_rest(pool, ltenant):
    build_node(pool, "n1", cpu=4000, memory=8192)
    now = timezone.now()
    bad = reserve(pool, ltenant, now)  # lower id: swept first
    good = reserve(pool, ltenant, now)
    corrupt_ledger(bad)

    assert expire_leases_task.delay(now=(now + 2 * MIN).isoformat()).get() == 1

    good.refresh_from_db()
    assert good.state == LeaseState.EXPIRED
    bad.refresh_from_db()
    assert bad.state == LeaseState.RESERVED  # unchanged, its transaction rolled back
    (failure,) = sweep_failures(bad)
    assert (failure.from_state, failure.to_state) == ("reserved", "reserved")
    assert "ledger" in failure.message and failure.actor_label == "system:lease-expiry"
    # the next sweep tries again but does not repeat the same record
    assert services.expire_leases(now=now + 3 * MIN) == 0
    assert len(sweep_failures(bad)) == 1


def test_uncertain_and_reservation_sweeps_skip_a_corrupt_lease(pool, ltenant):
    build_node(pool, "n1", cpu=4000, memory=8192)
    now = timezone.now()
    uncertain = [reserve(pool, ltenant, now, duration=60 * MIN) for _ in range(2)]
    for lease in uncertain:
        services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=now)
        services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=now)
    window = services.Window(now + 10 * MIN, now + 20 * MIN, MIN)
    held = [reserve(pool, ltenant, now, window=window) for _ in range(2)]
    corrupt_ledger(uncertain[0])
    corrupt_ledger(held[0])

    assert services.expire_uncertain(now=now + 11 * MIN, deadline=10 * MIN) == 1
    assert services.release_unclaimed_reservations(now=now + 12 * MIN) == 1

    for bad, good, ended in ((*uncertain, LeaseState.EXPIRED), (*held, LeaseState.RELEASED)):
        bad.refresh_from_db()
        good.refresh_from_db()
        assert good.state == ended
        assert bad.state != ended and len(sweep_failures(bad)) == 1


def test_requeue_sweep_skips_a_job_the_database_refuses(pool, ltenant):
    build_node(pool, "n1", cpu=4000, memory=8192)
    bad, good = submit_job(pool, ltenant, "bad"), submit_job(pool, ltenant, "good")
    scheduling_pass()
    later = timezone.now() + timedelta(hours=1)
    assert services.expire_leases(now=later) == 2
    refuse_rows("jobs_job", f"NEW.id = {bad.pk} AND NEW.state = 'queued'", on="UPDATE")

    assert requeue_jobs_without_lease(now=later) == [good.pk]

    bad.refresh_from_db()
    assert bad.state == JobState.LEASED
    event = bad.events.latest("id")
    assert (event.from_state, event.to_state, event.reason) == ("leased", "leased", "sweep_failed")
    assert "bad row refused" in event.message


# --- 3. no starvation through the window -----------------------------------------------------


def test_a_tenant_at_quota_cannot_starve_another_tenant(pool, ltenant, ltenant2):
    build_node(pool, "n1", cpu=64_000, memory=65_536)
    Quota.objects.create(tenant=ltenant, pool=pool, cpu_millicores=1000, memory_mib=10**6)
    reserve(pool, ltenant, timezone.now(), duration=60 * MIN)  # A is at its CPU quota
    blocked = [submit_job(pool, ltenant, f"a{i}") for i in range(50)]
    b_job = submit_job(pool, ltenant2, "b")  # the youngest job: behind all 50 in FIFO order

    result = scheduling_pass(limit=20)

    assert result.placed == [b_job.pk]
    for job in Job.objects.filter(pk__in=[j.pk for j in blocked]):
        assert job.state == JobState.QUEUED
        assert job.pending_reason["code"] == "quota_exceeded"
        assert "cpu_millicores" in job.pending_reason["message"]


def test_a_tenant_reaching_quota_mid_pass_is_skipped_cheaply(pool, ltenant, ltenant2):
    from django.test.utils import CaptureQueriesContext

    build_node(pool, "n1", cpu=64_000, memory=65_536)
    Quota.objects.create(
        tenant=ltenant, pool=pool, cpu_millicores=10**6, memory_mib=10**6, max_leases=1
    )
    a_jobs = [submit_job(pool, ltenant, f"a{i}") for i in range(50)]
    b_job = submit_job(pool, ltenant2, "b")

    with CaptureQueriesContext(connection) as queries:
        result = scheduling_pass(limit=20)

    assert sorted(result.placed) == sorted([a_jobs[0].pk, b_job.pk])
    waiting = Job.objects.filter(tenant=ltenant, state=JobState.QUEUED)
    assert waiting.count() == 49
    assert {j.pending_reason["code"] for j in waiting} == {"quota_exceeded"}
    # one plan for the window (its reads of standings, quotas and the snapshot, one apply), then
    # the rest of A's jobs noted in bulk: not a placement attempt (several queries) per job
    assert len(queries) < 80, len(queries)


# --- 4. unreachable nodes get nothing new ----------------------------------------------------


def unreachable(node):
    assert node_mark_unreachable(node=node, cutoff=timezone.now() + MIN, actor=SYSTEM)
    node.refresh_from_db()
    assert node.reachability == Reachability.UNREACHABLE


def test_the_snapshot_leaves_out_unreachable_nodes_and_explanations_count_them(pool, ltenant):
    build_node(pool, "n1", cpu=1000, memory=8192)
    unreachable(build_node(pool, "n2", cpu=4000, memory=8192))

    assert [n.name for n in snapshot.pool_snapshot(pool.pk).nodes] == ["n1"]
    lease = reserve(pool, ltenant, timezone.now())
    assert lease.node.name == "n1"
    with pytest.raises(services.NoCapacity) as refused:
        reserve(pool, ltenant, timezone.now())
    assert refused.value.status == 409
    assert refused.value.explanation["reasons"] == {"insufficient_cpu": 1, "node_unreachable": 1}


@pytest.mark.parametrize("portable", [False, True])
def test_a_node_going_unreachable_after_the_snapshot_is_refused_at_write(
    pool, ltenant, portable, settings
):
    settings.LEASE_PORTABLE_PATHS = portable  # True: the ORM paths SQLite takes (`make run`)
    node = build_node(pool, "n1", cpu=4000, memory=8192)
    view = snapshot.pool_snapshot(pool.pk, leases=False)  # taken while n1 is reachable
    policy = snapshot.pool_policy(pool)
    placement = place(snapshot.core_request(cpu_request()), view.nodes, policy)
    assert placement.node == "n1"
    unreachable(node)  # meanwhile: missed heartbeats

    now = timezone.now()
    shared = ledger.Shared(pool=pool, actor=SYSTEM, now=now, expires_at=now + MIN)
    row = ledger.lease_row(
        shared,
        tenant_id=ltenant.pk,
        request=cpu_request(),
        placement=placement,
        node_id=view.node_ids["n1"],
        allocations=[],
    )
    applied = ledger.apply([row])
    assert applied.taken == [] and applied.conflicts == [(row, node.pk)]

    assert not Lease.objects.filter(node=node).exists()
    assert not LeaseEvent.objects.filter(lease__node=node).exists()
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 0
