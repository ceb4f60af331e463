"""Preemption on the product path (scheduling/preemption.py): a queued job of a class that may
preempt, in a full pool, has lower-priority checkpointable work checkpoint through the agent's
flow, then takes its place; what may not be preempted never is. These pools give no notice
(`preemption_notice_s` 0): the notice and its call-off are test_preemption_notice.py's."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import (
    SYSTEM,
    build_priority_class,
    gpu_request,
    pinned_test_image,
    set_pool_knobs,
)
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_submit
from leases.choices import LeaseState
from leases.snapshot import core_request, pool_policy, pool_snapshot
from placement.preemption import choose_victims
from pools.reasons import Reason
from scheduling import drain, preemption
from scheduling.passes import requeue_jobs_without_lease, scheduling_pass
from tests.clients import bearer_client
from tests.jobs.test_agent_api import place, report, run
from tests.scheduling.test_lost import silence


@pytest.fixture(autouse=True)
def at_once(request):
    """A preemption decided is carried out in the same transaction, as before the notice."""
    if "agent" in request.fixturenames:
        set_pool_knobs(request.getfixturevalue("agent").node.pool, preemption_notice_s=0)


@pytest.fixture
def batch(db):
    return build_priority_class("batch", 10)


@pytest.fixture
def prod(db):
    return build_priority_class("prod", 1000, may_preempt=True)


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


def gpu_job(pool, tenant, klass, gpus=1, **fields):
    return job_submit(
        tenant=tenant,
        pool=pool,
        name=f"{klass.name}-{gpus}",
        image=pinned_test_image(),
        actor=SYSTEM,
        resources=gpu_request(count=gpus),
        priority_class=klass,
        **fields,
    )


def running(api, job):
    """Placed by the pass and running, as the agent reports it."""
    job, lease = place(job)
    run(api, job, lease)
    job.refresh_from_db()
    return job, lease


def unplaced(job):
    """Queued and not placed by a pass: the pool is full."""
    assert job.pk not in scheduling_pass(pool_id=job.pool_id).placed
    return job


def later(minutes=10):
    return timezone.now() + timedelta(minutes=minutes)


def test_a_priority_job_preempts_checkpointable_work_then_takes_its_place(
    agent, node_api, tenant, batch, prod
):
    low, lease = running(node_api, gpu_job(agent.node.pool, tenant, batch, 2, checkpointable=True))
    assert low.attempts == 1
    high = unplaced(gpu_job(agent.node.pool, tenant, prod))

    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later()) == {
        high.pk: "preempting"
    }

    low.refresh_from_db()
    assert low.state == JobState.CHECKPOINTING
    event = low.events.latest("id")
    assert (event.from_state, event.reason, event.actor_label) == (
        "running",
        Reason.PREEMPTED,
        "system:preemption",
    )
    assert event.data["preemptor"] == high.pk and event.data["preemptor_class"] == "prod"
    assert event.data["node"] == agent.node.name and event.data["lost_work_s"] >= 600
    high.refresh_from_db()
    assert high.state == JobState.QUEUED
    said = high.events.latest("id")
    assert (said.from_state, said.to_state, said.reason) == ("queued", "queued", "preempting")
    assert said.data == {
        "node": agent.node.name,
        "victims": 1,
        "classes": ["batch"],
        "victim_jobs": [low.pk],
        "notice_s": 0,
        "confirmed": True,
    }
    assert high.pending_reason["code"] == "preempting"

    # the agent's flow: the assignment asks for the checkpoint, the agent reports it
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert entry["job"] == low.pk and entry["checkpoint_requested"] is True
    assert report(node_api, low, lease, "checkpointed").json()["state"] == "queued"
    low.refresh_from_db()
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    assert low.attempts == 1  # the preempted attempt is counted; the next placement counts on

    # the next pass places the preemptor first; the victim waits its turn
    result = scheduling_pass(pool_id=agent.node.pool_id)
    assert result.placed == [high.pk] and low.pk in result.pending
    job_cancel(job=Job.objects.get(pk=high.pk), actor=SYSTEM)
    low, _ = place(low)
    assert low.attempts == 2


def test_non_checkpointable_work_is_never_preempted(agent, node_api, tenant, batch, prod):
    low, _ = running(node_api, gpu_job(agent.node.pool, tenant, batch, 2))
    high = unplaced(gpu_job(agent.node.pool, tenant, prod))

    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later(60)) == {high.pk: "none"}
    low.refresh_from_db()
    assert low.state == JobState.RUNNING
    assert not high.events.filter(reason=Reason.PREEMPTING).exists()


def test_work_of_a_class_that_is_not_preemptible_is_left_alone(
    agent, node_api, tenant, batch, prod
):
    batch.preemptible = False
    batch.save()
    low, _ = running(node_api, gpu_job(agent.node.pool, tenant, batch, 2, checkpointable=True))
    high = unplaced(gpu_job(agent.node.pool, tenant, prod))
    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later()) == {high.pk: "none"}
    low.refresh_from_db()
    assert low.state == JobState.RUNNING


def test_fresh_work_under_the_minimum_runtime_is_not_preempted(
    agent, node_api, tenant, batch, prod
):
    low, _ = running(node_api, gpu_job(agent.node.pool, tenant, batch, 2, checkpointable=True))
    high = unplaced(gpu_job(agent.node.pool, tenant, prod))

    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later(4)) == {high.pk: "none"}
    low.refresh_from_db()
    assert low.state == JobState.RUNNING
    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later(6)) == {
        high.pk: "preempting"
    }


def test_a_job_of_a_class_that_may_not_preempt_is_not_handled(agent, node_api, tenant, batch):
    running(node_api, gpu_job(agent.node.pool, tenant, batch, 2, checkpointable=True))
    rush = build_priority_class("rush", 500)  # higher, but may_preempt is false
    high = unplaced(gpu_job(agent.node.pool, tenant, rush))
    assert preemption.preempt_for(agent.node.pool_id, [high.pk], now=later()) == {}


def test_another_tenants_ids_are_not_revealed(agent, node_api, tenant, other_tenant, batch, prod):
    low, _ = running(
        node_api, gpu_job(agent.node.pool, other_tenant, batch, 2, checkpointable=True)
    )
    high = unplaced(gpu_job(agent.node.pool, tenant, prod))

    preemption.preempt_for(agent.node.pool_id, [high.pk], now=later())

    event = low.events.latest("id")
    assert event.reason == Reason.PREEMPTED and "preemptor" not in event.data
    assert (
        event.message == f"preempted for a prod job on {agent.node.name}: checkpoint, then re-queue"
    )
    said = high.events.latest("id")
    assert said.reason == Reason.PREEMPTING and "victim_jobs" not in said.data
    assert said.data["classes"] == ["batch"] and said.data["victims"] == 1
    assert str(low.pk) not in said.message


def test_work_already_checkpointing_is_waited_for_and_not_preempted_twice(
    agent, node_api, tenant, batch, prod
):
    """Two batch jobs of one GPU each: the first prod job preempts one and then waits for it;
    a second prod job does not count on the same GPU and preempts the other."""
    pool = agent.node.pool
    lows = [running(node_api, gpu_job(pool, tenant, batch, checkpointable=True))[0] for _ in "ab"]
    first = unplaced(gpu_job(pool, tenant, prod))

    assert preemption.preempt_for(pool.pk, [first.pk], now=later()) == {first.pk: "preempting"}
    assert preemption.preempt_for(pool.pk, [first.pk], now=later()) == {first.pk: "waiting"}
    states = sorted(Job.objects.filter(pk__in=[j.pk for j in lows]).values_list("state", flat=True))
    assert states == ["checkpointing", "running"]
    first.refresh_from_db()
    assert first.pending_reason["code"] == "preempting"
    assert "waits for preempted work" in first.pending_reason["message"]

    second = unplaced(gpu_job(pool, tenant, prod))
    outcome = preemption.preempt_for(pool.pk, [first.pk, second.pk], now=later())
    assert outcome == {first.pk: "waiting", second.pk: "preempting"}
    states = set(Job.objects.filter(pk__in=[j.pk for j in lows]).values_list("state", flat=True))
    assert states == {"checkpointing"}


def test_a_victim_that_ended_meanwhile_calls_the_preemption_off(
    agent, node_api, tenant, batch, prod
):
    pool = agent.node.pool
    low, _ = running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    high = unplaced(gpu_job(pool, tenant, prod))
    high = Job.objects.select_related("priority_class").get(pk=high.pk)  # as preempt_for reads it
    now = later()
    nodes = pool_snapshot(pool.pk).nodes
    request = replace(core_request(high.resources, high.tenant_id), priority=1000)
    candidates = preemption.running_candidates(pool.pk, nodes)
    choice = choose_victims(request, nodes, candidates, pool_policy(pool), now=now.timestamp())
    assert [v.job for v in choice.victims] == [low.pk]
    job_cancel(job=low, actor=SYSTEM)  # it ends between the choice and the write

    assert preemption._decide(high, choice, now, notice_s=0) == ""
    assert preemption._decide(high, choice, now, notice_s=10) == ""

    low.refresh_from_db()
    assert low.state == JobState.CANCELLED
    assert not high.events.filter(reason=Reason.PREEMPTING).exists()


def test_a_victim_whose_agent_never_reports_is_lost_or_retried(
    agent, node_api, tenant, batch, prod
):
    """The agent went silent before reporting the checkpoint: as for any job of a silent node,
    the lease expires and the stranded-jobs sweep retries the job (its policy retries
    node_lost) — stopped and queued again, its capacity back."""
    retry = {"max_attempts": 3, "backoff_s": 0, "retry_on": ["node_lost"]}
    pool = agent.node.pool
    low, lease = running(
        node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True, retry_policy=retry)
    )
    high = unplaced(gpu_job(pool, tenant, prod))
    assert preemption.preempt_for(pool.pk, [high.pk], now=later())[high.pk] == "preempting"

    gone = silence(agent, timezone.now())

    assert requeue_jobs_without_lease(now=gone) == [low.pk]
    low.refresh_from_db()
    lease.refresh_from_db()
    assert low.state == JobState.QUEUED and lease.state == LeaseState.EXPIRED
    event = low.events.latest("id")
    assert (event.from_state, event.reason) == ("checkpointing", Reason.RETRY_SCHEDULED)


def test_a_victim_whose_live_agent_never_reports_is_requeued_at_the_checkpoint_deadline(
    agent, node_api, tenant, batch, prod
):
    """The agent keeps heartbeating but never reports the checkpoint: past the pool's stop
    grace and the report margin the job is queued again and its lease released, so the job
    leaves the node's assignments (the agent stops what is no longer assigned)."""
    pool = agent.node.pool
    low, lease = running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    high = unplaced(gpu_job(pool, tenant, prod))
    asked = later()
    assert preemption.preempt_for(pool.pk, [high.pk], now=asked)[high.pk] == "preempting"
    low.refresh_from_db()
    assert low.state == JobState.CHECKPOINTING
    Job.objects.filter(pk=low.pk).update(state_changed_at=asked)

    assert drain.checkpoint_deadline_sweep(now=asked + timedelta(minutes=5)) == []
    deadline = asked + drain.CHECKPOINT_REPORT_MARGIN + timedelta(seconds=11)
    assert drain.checkpoint_deadline_sweep(now=deadline) == [low.pk]
    low.refresh_from_db()
    lease.refresh_from_db()
    assert low.state == JobState.QUEUED and lease.state == LeaseState.RELEASED
    assert low.events.latest("id").reason == Reason.CHECKPOINT_TIMED_OUT
    assigned = node_api.get("/api/v1/agent/assignments").json()
    assert low.pk not in [a["job"] for a in assigned]
    assert drain.checkpoint_deadline_sweep(now=deadline) == []  # once


def test_one_bad_job_never_stops_the_others(agent, node_api, tenant, batch, prod):
    pool = agent.node.pool
    running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    broken = unplaced(gpu_job(pool, tenant, prod))
    good = unplaced(gpu_job(pool, tenant, prod))
    Job.objects.filter(pk=broken.pk).update(resources={"cpu_millicores_min": "lots"})

    outcome = preemption.preempt_for(pool.pk, [broken.pk, good.pk], now=later())

    assert outcome == {broken.pk: "error", good.pk: "preempting"}
    broken.refresh_from_db()
    assert broken.state == JobState.QUEUED
    assert broken.pending_reason["code"] == Reason.SCHEDULING_ERROR


def test_the_scheduling_pass_itself_preempts_for_work_that_waits_for_capacity(
    agent, node_api, tenant, batch, prod
):
    low, _ = running(node_api, gpu_job(agent.node.pool, tenant, batch, 2, checkpointable=True))
    high = gpu_job(agent.node.pool, tenant, prod)
    result = scheduling_pass(pool_id=agent.node.pool_id, now=later())
    assert result.pending[high.pk] == "no_capacity"
    low.refresh_from_db()
    high.refresh_from_db()
    assert low.state == JobState.CHECKPOINTING
    assert low.events.latest("at").reason == Reason.PREEMPTED
    assert high.events.filter(reason=Reason.PREEMPTING).exists()
