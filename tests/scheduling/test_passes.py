"""The scheduling pass turns queued jobs into leases, in priority order, and explains the rest."""

import asyncio
import contextlib
import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.utils import timezone

from config.builders import (
    build_node,
    build_person,
    build_pool,
    build_tenant,
    cpu_request,
    gpu_request,
    submit_job,
    submit_jobs,
)
from jobs.choices import JobState
from jobs.events import STREAM as JOB_STREAM
from jobs.models import Job, JobEvent
from jobs.services import job_cancel
from leases import selectors
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import SCHEDULER_KEY_PREFIX, expire_leases, ledger
from pools.actors import Actor
from pools.events import object_group, tenant_group
from pools.models import PriorityClass, Quota
from pools.services import policy_version_publish
from scheduling import passes
from scheduling.bench.scheduler import jobs_without_one_lease, overcommitted_nodes
from scheduling.pass_steps import single as single_path
from scheduling.passes import requeue_jobs_without_lease, scheduling_pass
from scheduling.tasks import scheduling_pass as scheduling_pass_task
from tests.live_events import own_channel_layer
from tests.scheduling.conftest import another_writer_takes_before_apply


def test_places_highest_priority_first_then_oldest(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    batch = PriorityClass.objects.create(name="batch", value=100)
    prod = PriorityClass.objects.create(name="prod", value=1000)
    old_batch = submit_job(lpool, ltenant, "old-batch", priority=batch)
    new_batch = submit_job(lpool, ltenant, "new-batch", priority=batch)
    prod_job = submit_job(lpool, ltenant, "prod", priority=prod)

    result = scheduling_pass()

    assert result.placed == [prod_job.pk, old_batch.pk]
    assert result.pending == {new_batch.pk: "no_capacity"}
    prod_job.refresh_from_db()
    assert prod_job.state == JobState.LEASED and prod_job.attempts == 1
    event = prod_job.events.latest("id")
    assert (event.to_state, event.reason, event.actor_label) == (
        "leased",
        "placed",
        "system:scheduler",
    )
    lease = Lease.objects.get(job=prod_job)
    assert lease.state == LeaseState.RESERVED and event.data["lease"] == lease.pk
    assert ledger_problems(lpool) == []


def test_a_job_that_does_not_fit_says_why(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    job = submit_job(lpool, ltenant, "too-big", cpu=1500)
    submit_job(lpool, ltenant, "fits", cpu=1000)
    scheduling_pass()  # "too-big" takes the node first (older), "fits" must then wait
    waiting = Job.objects.get(name="fits")
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason["code"] == "no_capacity"
    assert waiting.pending_reason["reasons"] == {"insufficient_cpu": 1}
    assert "n1" in waiting.pending_reason["message"] or waiting.pending_reason["nearest_miss"]
    job.refresh_from_db()
    assert job.state == JobState.LEASED and job.pending_reason == {}


def test_expired_lease_requeues_the_job_and_the_next_pass_places_it_again(lpool, ltenant):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    job = submit_job(lpool, ltenant, "j")
    scheduling_pass()
    later = timezone.now() + timedelta(hours=1)
    assert expire_leases(now=later) == 1
    assert requeue_jobs_without_lease(now=later) == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.events.latest("id").reason == "lease_expired"
    assert requeue_jobs_without_lease(now=later) == []  # guarded: nothing twice
    assert scheduling_pass_task.delay().get()["placed"] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.LEASED and job.attempts == 2
    assert Lease.objects.filter(job=job).count() == 2
    assert ledger_problems(lpool) == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_passes_never_place_a_job_twice_nor_overcommit():
    pool = build_pool("race", exact_capacity=True)
    tenant = build_tenant("race", name="Race")
    for i in range(3):
        build_node(pool, f"n{i}", cpu=4000, memory=8192)
    jobs = [submit_job(pool, tenant, f"j{i}", cpu=1000) for i in range(20)]  # 12 fit
    barrier = threading.Barrier(4)

    def run_pass():
        try:
            barrier.wait()
            scheduling_pass()
        finally:
            connection.close()

    threads = [threading.Thread(target=run_pass) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    leased = Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.LEASED)
    assert leased.count() == 12
    for job in leased:
        assert Lease.objects.filter(job=job).count() == 1
    assert Job.objects.filter(state=JobState.QUEUED).count() == 8
    assert selectors.overcommitted_nodes(pool) == 0
    assert ledger_problems(pool) == []


# --- the batch pass: plan on one snapshot, apply in one transaction ---------------------------


def mixed_fleet(pool):
    """Two CPU nodes, an exclusive-GPU node, a MIG node and a time-sliced node."""
    build_node(pool, "cpu-1", cpu=8000, memory=16384)
    build_node(pool, "cpu-2", cpu=8000, memory=16384)
    build_node(pool, "gpu-1", cpu=16000, memory=65536, gpus=[{}, {}])
    build_node(pool, "mig-1", cpu=16000, memory=65536, gpus=[{"mig_enabled": True}])
    build_node(pool, "ts-1", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])


def mixed_queue(pool, tenants, count):
    shapes = [
        cpu_request(cpu=1000, memory=1024),
        gpu_request("exclusive", count=1, cpu=2000, memory=4096),
        gpu_request("mig", count=1, mig_profile="1g.10gb", cpu=1000, memory=1024),
        gpu_request("timeslice", count=1, milli=250, cpu=1000, memory=1024),
    ]
    return submit_jobs(
        pool,
        [
            {"tenant": tenants[i % len(tenants)], "name": f"j{i}", "resources": shapes[i % 4]}
            for i in range(count)
        ],
    )


def test_every_placement_keeps_its_decision_record(lpool, ltenant):
    mixed_fleet(lpool)
    job = submit_job(lpool, ltenant, "small")
    assert scheduling_pass().placed == [job.pk]
    decision = Lease.objects.get(job=job).placement["decision"]
    assert decision["chosen"] == Lease.objects.get(job=job).placement["node"]
    assert decision["policy_version"] == 1 and decision["nodes"] == 5
    assert decision["rejected"] == {}
    assert 1 <= len(decision["candidates"]) <= 3
    assert decision["candidates"][0]["node"] == decision["chosen"]
    assert "node_in_use" in decision["candidates"][0]["breakdown"]


@pytest.mark.django_db(transaction=True)
def test_passes_racing_on_postgresql_never_double_book():
    pool = build_pool("race", exact_capacity=True)
    tenants = [build_tenant(f"race-{i}") for i in range(3)]
    mixed_fleet(pool)
    jobs = mixed_queue(pool, tenants, 120)  # more than fits
    barrier = threading.Barrier(3)
    results = []

    def run_pass():
        try:
            barrier.wait()
            results.append(scheduling_pass(pool_id=pool.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=run_pass) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    placed = [job_id for result in results for job_id in result.placed]
    assert placed and len(placed) == len(set(placed))  # no job placed by two passes
    assert overcommitted_nodes(pool) == 0  # counted from the leases, not the ledger
    assert jobs_without_one_lease(pool) == 0
    assert ledger_problems(pool) == []
    leased = Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.LEASED)
    assert sorted(leased.values_list("id", flat=True)) == sorted(placed)


def test_a_node_taken_before_the_plan_applies_leaves_its_jobs_queued_with_plan_conflict(
    lpool, ltenant
):
    build_node(lpool, "n1", cpu=2000, memory=4096)
    build_node(lpool, "n2", cpu=2000, memory=4096)
    first = submit_job(lpool, ltenant, "first", cpu=2000)
    second = submit_job(lpool, ltenant, "second", cpu=2000)
    with another_writer_takes_before_apply(ltenant, "n1", cpu=2000):
        result = scheduling_pass()

    on_n1 = next(j for j in (first, second) if j.pk not in result.placed)
    assert len(result.placed) == 1 and result.pending == {on_n1.pk: "plan_conflict"}
    on_n1.refresh_from_db()
    assert on_n1.state == JobState.QUEUED
    assert on_n1.pending_reason["code"] == "plan_conflict"
    assert "n1" in on_n1.pending_reason["message"]
    assert not Lease.objects.filter(job=on_n1).exists()
    assert ledger_problems(lpool) == [] and selectors.overcommitted_nodes(lpool) == 0


def test_a_tenant_over_quota_waits_and_the_others_are_placed(lpool, ltenant, ltenant2):
    build_node(lpool, "n1", cpu=16000, memory=65536)
    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=2000, memory_mib=10**6)
    mine = [submit_job(lpool, ltenant, f"a{i}", cpu=1000) for i in range(3)]
    theirs = submit_job(lpool, ltenant2, "b", cpu=1000)
    result = scheduling_pass()
    assert sorted(result.placed) == sorted([mine[0].pk, mine[1].pk, theirs.pk])
    waiting = Job.objects.get(pk=mine[2].pk)
    assert waiting.pending_reason["code"] == "quota_exceeded"
    assert "cpu_millicores" in waiting.pending_reason["message"]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_waits_for_the_pass_that_holds_the_job_then_releases_its_lease():
    """The batch pass has locked the job and inserted its lease; the cancel waits on the job's
    row lock and, once the pass commits, cancels the leased job and releases the lease."""
    from tests.scheduling.test_cancel_race import (
        assert_cancelled_cleanly,
        race,
        wait_until_someone_waits_on_a_lock,
    )

    pool = build_pool("race", exact_capacity=True)
    node = build_node(pool, "n1", cpu=8000, memory=16384)
    tenant = build_tenant("racer", name="Racer")
    person = build_person("rita", tenant=tenant)
    job = submit_job(pool, tenant)
    inserted = threading.Event()

    def signal_and_wait(rows):
        inserted.set()
        wait_until_someone_waits_on_a_lock()

    def cancel():
        assert inserted.wait(10)
        return job_cancel(job=job, actor=Actor.for_user(person))

    # the pass holds the job's row lock while the ledger writes the leases of its plan
    with ledger.race_hook(ledger.AFTER_INSERTS, signal_and_wait):
        placing, cancelled = race(lambda: scheduling_pass(pool_id=pool.pk), cancel)
    assert not isinstance(cancelled, Exception), cancelled
    assert placing.placed == [job.pk]
    assert assert_cancelled_cleanly(job, pool, node) == ["queued", "leased", "cancelled"]


# --- the queue's order and gate, on the product path -----------------------------------------


def publish_knobs(pool, **knobs):
    current = pool.scheduling_policy.versions.order_by("-number").first()
    policy_version_publish(
        policy=pool.scheduling_policy, weights=current.weights, knobs=knobs, actor=Actor.system("t")
    )


def test_fair_share_puts_the_tenant_that_holds_less_first(lpool, ltenant, ltenant2):
    build_node(lpool, "n1", cpu=4000, memory=8192)
    held = submit_job(lpool, ltenant, "held", cpu=2000)
    assert scheduling_pass().placed == [held.pk]
    # the same priority; the first tenant's job is older, but it already holds half the pool
    again = submit_job(lpool, ltenant, "again", cpu=2000)
    newcomer = submit_job(lpool, ltenant2, "newcomer", cpu=2000)
    assert scheduling_pass().placed == [newcomer.pk]
    again.refresh_from_db()
    assert again.pending_reason["reasons"] == {"insufficient_cpu": 1}


def test_a_pool_keeps_a_share_for_short_jobs_when_its_policy_says_so(lpool, ltenant):
    build_node(lpool, "n1", cpu=4000, memory=8192)
    publish_knobs(lpool, short_job_share=0.5, short_job_max_runtime_s=600)
    long = submit_job(lpool, ltenant, "long", cpu=3000, max_runtime_s=3600)
    short = submit_job(lpool, ltenant, "short", cpu=3000, max_runtime_s=300)
    assert scheduling_pass().placed == [short.pk]
    long.refresh_from_db()
    assert long.pending_reason["code"] == "short_share_reserved"
    assert "short jobs" in long.pending_reason["message"]


def test_a_job_over_quota_waits_with_the_dimension_named(lpool, ltenant):
    build_node(lpool, "n1", cpu=4000, memory=8192)
    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=1500, memory_mib=10**6)
    first = submit_job(lpool, ltenant, "first", cpu=1000)
    second = submit_job(lpool, ltenant, "second", cpu=1000)
    assert scheduling_pass().placed == [first.pk]
    second.refresh_from_db()
    assert second.pending_reason["code"] == "quota_exceeded"
    assert second.pending_reason["dimension"] == "cpu_millicores"


def test_the_batch_pass_writes_what_the_single_path_writes(lpool, ltenant):
    """The pass builds its rows as plain dicts over one base row per table: each lease, its
    `reserved` event and the job's `placed` event hold what `lease_reserve` and
    `job_transition` write for the same job, apart from ids, times and the decision record;
    for a gang's member too, whose `placed` event names its gang on both paths."""
    mixed_fleet(lpool)
    request = gpu_request("timeslice", count=1, milli=250, cpu=1000, memory=1024)

    def queue(side: str) -> list[Job]:  # one job alone, then a gang of two
        gang = {"name": f"pair-{side}", "size": 2, "topology": "spread_hosts"}
        member = cpu_request(cpu=1000, memory=1024)
        specs = [{"tenant": ltenant, "name": side, "resources": request}]
        specs += [
            {"tenant": ltenant, "name": f"{side}{i}", "resources": member, "gang": gang}
            for i in range(2)
        ]
        return submit_jobs(lpool, specs)

    batch = queue("a")
    assert sorted(scheduling_pass(pool_id=lpool.pk).placed) == [j.pk for j in batch]
    single = queue("b")
    result = passes.PassResult()
    single_path.one_by_one([j.pk for j in single], timezone.now(), result)  # the single path
    assert result.placed == [j.pk for j in single]
    assert_written_alike(batch[0], single[0])
    assert_written_alike(batch[1], single[1], gang=("pair-a", "pair-b"))


def assert_written_alike(first: Job, second: Job, gang=("", "")) -> None:
    def columns(obj, *without):
        skip = {"id", "job", "lease", "at", "created_at", "state_changed_at", "expires_at"}
        skip |= set(without)
        return {
            f.attname: getattr(obj, f.attname)
            for f in type(obj)._meta.concrete_fields
            if f.name not in skip
        }

    batch, single = (Lease.objects.get(job=job) for job in (first, second))
    assert batch.expires_at - batch.created_at == single.expires_at - single.created_at
    assert batch.idempotency_key == f"{SCHEDULER_KEY_PREFIX}{first.pk}-attempt-1"
    decision = batch.placement.pop("decision")
    assert decision["chosen"] == batch.placement["node"]
    assert decision.get("gang", "") == gang[0]
    keyed = ("idempotency_key", "fencing_token", "placement", "gpu_allocations")
    if gang[1]:  # the single path reserves each member pinned to the node its gang planned
        assert single.request == {**batch.request, "node_pin": single.placement["node"]}
        keyed += ("request", "idempotency_digest", "node")  # each gang planned on its own
    assert columns(batch, *keyed) == columns(single, *keyed)
    assert set(batch.placement) == set(single.placement)
    assert [{**a, "gpu": 0} for a in batch.gpu_allocations] == [
        {**a, "gpu": 0} for a in single.gpu_allocations
    ]
    events = [lease.events.get() for lease in (batch, single)]
    assert columns(events[0], "message", "data") == columns(events[1], "message", "data")
    assert [e.message for e in events] == [
        f"reserved on {x.placement['node']}" for x in (batch, single)
    ]
    assert set(events[0].data) == set(events[1].data) == {"node", "score"}
    placed = [job.events.get(reason="placed") for job in (first, second)]
    assert columns(placed[0], "message", "data") == columns(placed[1], "message", "data")
    for event, lease, name in zip(placed, (batch, single), gang, strict=True):
        node = lease.placement["node"]
        with_gang = f" with gang {name}" if name else ""
        assert event.message == f"placed on {node}{with_gang} (lease {lease.pk})"
        assert event.data == {
            "lease": lease.pk,
            "node": node,
            "policy_version": lease.policy_version,
            **({"gang": name} if name else {}),
        }
    for job in (first, second):
        job.refresh_from_db()
        assert (job.state, job.attempts, job.pending_reason) == (JobState.LEASED, 1, {})


def test_every_lease_of_a_pass_has_its_own_fencing_token(lpool, ltenant):
    build_node(lpool, "n1", cpu=16000, memory=65536)
    jobs = [submit_job(lpool, ltenant, f"j{i}") for i in range(5)]
    assert len(scheduling_pass(pool_id=lpool.pk).placed) == 5
    tokens = Lease.objects.filter(job__in=jobs).values_list("fencing_token", flat=True)
    assert len(set(tokens)) == 5


def test_a_pass_wakes_each_placed_jobs_group_and_its_tenants_once(lpool, ltenant):
    """After commit, on the pass's publishing thread: one wake-up per group (the consumers read
    the `placed` events themselves), so three jobs of one tenant wake its group once."""
    build_node(lpool, "n1", cpu=16000, memory=65536)
    jobs = [submit_job(lpool, ltenant, f"live-{i}") for i in range(3)]
    groups = [tenant_group(JOB_STREAM, ltenant.pk), *(object_group(JOB_STREAM, j.pk) for j in jobs)]

    with own_channel_layer():
        layer = get_channel_layer()

        async def subscribe():
            channel = await layer.new_channel()
            for group in groups:
                await layer.group_add(group, channel)
            return channel

        async def receive_all(channel):
            messages = []
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    messages.append(await asyncio.wait_for(layer.receive(channel), 2))
            return messages

        channel = async_to_sync(subscribe)()
        assert len(scheduling_pass(pool_id=lpool.pk).placed) == 3
        messages = async_to_sync(receive_all)(channel)
    # one channel in four groups: the tenant's once, each job's once; nothing but a wake-up
    assert messages == [{"type": "entity.event"}] * 4


def test_copy_rows_refuses_rows_whose_columns_differ(lpool, ltenant):
    """COPY writes every row in the first row's column order: a row with other columns would
    land in the wrong ones, so it is refused and nothing is written."""
    job = submit_job(lpool, ltenant)
    base = JobEvent.build(None, actor=Actor.system("t"), from_state="", to_state="queued",
                          reason="submitted")  # fmt: skip
    before = JobEvent.objects.count()
    with pytest.raises(ValueError, match="other columns"), transaction.atomic():
        ledger.copy_rows(base, [{"job_id": job.pk, "message": "a"}, {"job_id": job.pk, "data": {}}])
    assert JobEvent.objects.count() == before
    ledger.copy_rows(base, [{"job_id": job.pk, "message": m} for m in ("a", "b")])
    assert list(job.events.filter(message__in="ab").values_list("message", flat=True)) == [
        "a",
        "b",
    ]


def test_a_head_that_fits_only_on_nodes_never_ready_blocks_no_one(lpool, ltenant):
    """An idle pool stayed idle 16+ minutes: the head job fit only on nodes registered but
    never ready, and held the gate. It now waits with its own reason; the next job runs."""
    build_node(lpool, "small-ready", cpu=4000, memory=8192)
    build_node(lpool, "big-registered", cpu=64000, memory=262144, ready=False)
    prod = PriorityClass.objects.create(name="prod", value=1000)
    head = submit_job(lpool, ltenant, "big", cpu=32000, memory=65536, priority=prod)
    small = submit_job(lpool, ltenant, "small", cpu=1000, memory=1024)
    result = scheduling_pass()
    assert result.placed == [small.pk]
    head.refresh_from_db()
    assert head.state == JobState.QUEUED
    assert head.pending_reason["code"] == "no_ready_node"
    assert "no other job waits for it" in head.pending_reason["message"]
    assert ledger_problems(lpool) == []


def test_a_head_that_fits_a_ready_node_once_it_empties_still_holds_the_gate(lpool, ltenant):
    build_node(lpool, "only", cpu=4000, memory=8192)
    prod = PriorityClass.objects.create(name="prod", value=1000)
    running = submit_job(lpool, ltenant, "running", cpu=3000, memory=1024)
    assert scheduling_pass().placed == [running.pk]
    head = submit_job(lpool, ltenant, "head", cpu=4000, memory=1024, priority=prod)
    later = submit_job(lpool, ltenant, "later", cpu=1000, memory=1024)  # no declared end
    assert scheduling_pass().placed == []
    head.refresh_from_db()
    later.refresh_from_db()
    assert head.pending_reason["code"] == "no_capacity"
    assert later.pending_reason["code"] == "backfill_would_delay_head"
    # its own job ahead is named, with advice that would work (a runtime under its start)
    assert later.pending_reason["blocker_job"] == head.pk
    assert f"your job {head.pk}" in later.pending_reason["message"]
    assert "declare a maximum runtime under" in later.pending_reason["advice"]
    # and following it works: the same job with a runtime under that bound runs now
    bound = int(later.pending_reason["advice"].split("under ")[1].split(" s")[0])
    heeded = submit_job(lpool, ltenant, "heeded", cpu=1000, memory=1024, max_runtime_s=bound - 1)
    assert scheduling_pass().placed == [heeded.pk]


def test_another_tenants_job_ahead_is_never_named_nor_timed(lpool, ltenant, ltenant2):
    build_node(lpool, "only", cpu=4000, memory=8192)
    prod = PriorityClass.objects.create(name="prod", value=1000)
    running = submit_job(lpool, ltenant, "running", cpu=3000, memory=1024)
    assert scheduling_pass().placed == [running.pk]
    head = submit_job(lpool, ltenant, "head", cpu=4000, memory=1024, priority=prod)
    later = submit_job(lpool, ltenant2, "later", cpu=1000, memory=1024)
    assert scheduling_pass().placed == []
    later.refresh_from_db()
    reason = later.pending_reason
    assert reason["code"] == "backfill_would_delay_head"
    assert "a job of another tenant" in reason["message"] and "blocker_job" not in reason
    assert str(head.pk) not in str(reason)
    # the head starts within the hour: no runtime is surely short enough, so no runtime advice
    assert reason["advice"] == "wait: it runs once the job ahead of it has started"
