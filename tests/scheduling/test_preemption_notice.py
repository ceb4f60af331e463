"""The preemption notice (scheduling/preemption.py, docs/scheduler.md "Preemption"): a pass that
chooses victims only records the decision; a later pass carries it out once the pool's
`preemption_notice_s` has passed, if the preemptor still needs it — else it is called off and
the victims never hear of it. Submitting a preempting job and cancelling it stops nothing."""

import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config.builders import (
    SYSTEM,
    build_priority_class,
    set_pool_knobs,
)
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel
from leases.snapshot import core_request, pool_policy, pool_snapshot
from placement.preemption import choose_victims
from pools.reasons import Reason
from scheduling import preemption
from scheduling.models import NoticedVictim, PreemptionNotice
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client
from tests.jobs.test_agent_api import report
from tests.scheduling.test_preemption import gpu_job, running

NOTICE_S = 30


@pytest.fixture
def pool(agent):
    """The agent's pool (one node, two GPUs) with a notice of 30 s."""
    set_pool_knobs(agent.node.pool, preemption_notice_s=NOTICE_S)
    return agent.node.pool


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


@pytest.fixture
def batch(db):
    return build_priority_class("batch", 10)


@pytest.fixture
def prod(db):
    return build_priority_class("prod", 1000, may_preempt=True)


def decided_at():
    """Past the victims' minimum runtime (300 s)."""
    return timezone.now() + timedelta(minutes=10)


def after(t, seconds):
    return t + timedelta(seconds=seconds)


def signalled(api, job) -> bool:
    """What the node's agent reads in its next poll: is the job asked to checkpoint?"""
    entry = next(a for a in api.get("/api/v1/agent/assignments").json() if a["job"] == job.pk)
    return entry["checkpoint_requested"]


def spared(api, victim):
    victim.refresh_from_db()
    assert victim.state == JobState.RUNNING
    assert not victim.events.filter(reason=Reason.PREEMPTED).exists()
    assert not signalled(api, victim)


def called_off(job) -> dict:
    [event] = job.events.filter(reason=Reason.PREEMPTION_CALLED_OFF)
    assert not PreemptionNotice.objects.filter(preemptor_id=job.pk).exists()
    return event


def test_the_victims_are_checkpointed_only_once_the_notice_is_over(
    pool, node_api, tenant, other_tenant, batch, prod
):
    low, _ = running(node_api, gpu_job(pool, other_tenant, batch, 2, checkpointable=True))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()

    assert scheduling_pass(pool_id=pool.pk, now=t0).pending[high.pk] == "no_capacity"
    spared(node_api, low)  # decided, nothing touched
    [said] = high.events.filter(reason=Reason.PREEMPTING)
    assert said.to_state == "queued" and said.at == t0
    assert said.data == {"node": pool.nodes.get().name, "victims": 1, "classes": ["batch"]} | {
        "notice_s": NOTICE_S
    }
    high.refresh_from_db()
    assert high.pending_reason["code"] == "preempting"
    assert "waits for its notice" in high.pending_reason["message"]

    # while the notice runs the preemptor chooses nothing new
    assert preemption.preempt_for(pool.pk, [high.pk], now=after(t0, 10)) == {high.pk: "noticed"}
    scheduling_pass(pool_id=pool.pk, now=after(t0, NOTICE_S - 1))
    spared(node_api, low)
    assert high.events.filter(reason=Reason.PREEMPTING).count() == 1
    assert PreemptionNotice.objects.get(preemptor=high).decided_at == t0

    # the notice is over, the preemptor still waits and still does not fit: carried out
    scheduling_pass(pool_id=pool.pk, now=after(t0, NOTICE_S))
    low.refresh_from_db()
    assert low.state == JobState.CHECKPOINTING and signalled(node_api, low)
    event = low.events.latest("id")
    assert (event.reason, event.at) == (Reason.PREEMPTED, after(t0, NOTICE_S))
    assert "preemptor" not in event.data  # another tenant's
    confirmed = high.events.filter(reason=Reason.PREEMPTING).latest("id")
    assert confirmed.data["confirmed"] is True and "victim_jobs" not in confirmed.data
    assert not PreemptionNotice.objects.exists() and not NoticedVictim.objects.exists()
    assert not high.events.filter(reason=Reason.PREEMPTION_CALLED_OFF).exists()


def test_submitting_and_cancelling_at_once_spares_the_victim(
    pool, node_api, tenant, other_tenant, batch, prod
):
    low, _ = running(node_api, gpu_job(pool, other_tenant, batch, 2, checkpointable=True))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)
    assert PreemptionNotice.objects.filter(preemptor=high).exists()

    job_cancel(job=Job.objects.get(pk=high.pk), actor=SYSTEM)

    event = called_off(high)  # at once, not at the next pass
    assert event.data["why"] == "cancelled" and "cancelled" in event.message
    assert (event.from_state, event.to_state) == ("cancelled", "cancelled")
    for seconds in (NOTICE_S, 10 * NOTICE_S):
        scheduling_pass(pool_id=pool.pk, now=after(t0, seconds))
        spared(node_api, low)


def test_a_preemptor_placed_elsewhere_before_the_notice_ends_spares_the_victim(
    pool, node_api, tenant, batch, prod
):
    """One GPU held by a checkpointable batch job (the victim), the other by work that may
    not be preempted; that work ends during the notice and the preemptor is placed there."""
    low, _ = running(node_api, gpu_job(pool, tenant, batch, checkpointable=True))
    other, other_lease = running(node_api, gpu_job(pool, tenant, batch))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)
    notice = PreemptionNotice.objects.get(preemptor=high)
    assert list(notice.victims.values_list("job_id", flat=True)) == [low.pk]

    assert report(node_api, other, other_lease, "succeeded", exit_code=0).status_code == 200
    result = scheduling_pass(pool_id=pool.pk, now=after(t0, 5))

    assert result.placed == [high.pk]
    event = called_off(high)
    assert event.data == {"node": notice.node, "why": "placed", "victims": 1}
    for seconds in (NOTICE_S, 10 * NOTICE_S):
        scheduling_pass(pool_id=pool.pk, now=after(t0, seconds))
        spared(node_api, low)


def test_a_preemptor_that_fits_without_preemption_calls_it_off(pool, node_api, tenant, batch, prod):
    low, _ = running(node_api, gpu_job(pool, tenant, batch, checkpointable=True))
    other, other_lease = running(node_api, gpu_job(pool, tenant, batch))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)
    report(node_api, other, other_lease, "succeeded", exit_code=0)

    # settled before any pass placed it (capacity came free after the pass's snapshot)
    assert preemption.settle(pool.pk, now=after(t0, NOTICE_S)) == {high.pk: "called_off"}

    assert called_off(high).data["why"] == "fits"
    spared(node_api, low)
    high.refresh_from_db()
    assert high.state == JobState.QUEUED


def test_a_victim_that_ends_during_the_notice_calls_it_off(pool, node_api, tenant, batch, prod):
    low, _ = running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)
    job_cancel(job=Job.objects.get(pk=low.pk), actor=SYSTEM)  # its lease: stopping, still held

    assert preemption.settle(pool.pk, now=after(t0, NOTICE_S)) == {high.pk: "called_off"}

    event = called_off(high)
    assert event.data["why"] == "victim_ended" and "no work was stopped" in event.message
    low.refresh_from_db()
    assert low.state == JobState.CANCELLED
    assert not low.events.filter(reason=Reason.PREEMPTED).exists()


def test_noticed_victims_are_not_chosen_again(pool, node_api, tenant, batch, prod):
    """Two one-GPU batch jobs, two prod jobs: each prod job notices its own victim, and while
    the notices run neither chooses again."""
    lows = [running(node_api, gpu_job(pool, tenant, batch, checkpointable=True))[0] for _ in "ab"]
    highs = [gpu_job(pool, tenant, prod) for _ in "ab"]
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)

    victims = dict(NoticedVictim.objects.values_list("notice__preemptor_id", "job_id"))
    assert sorted(victims) == sorted(h.pk for h in highs)
    assert sorted(victims.values()) == sorted(low.pk for low in lows)
    outcome = preemption.preempt_for(pool.pk, [h.pk for h in highs], now=after(t0, 5))
    assert outcome == {h.pk: "noticed" for h in highs}
    assert dict(NoticedVictim.objects.values_list("notice__preemptor_id", "job_id")) == victims
    for low in lows:
        spared(node_api, low)

    scheduling_pass(pool_id=pool.pk, now=after(t0, NOTICE_S))
    states = set(Job.objects.filter(pk__in=[j.pk for j in lows]).values_list("state", flat=True))
    assert states == {"checkpointing"}


def test_a_victim_noticed_by_one_worker_is_refused_to_another(pool, node_api, tenant, batch, prod):
    """Two workers chose the same victim from the same snapshot: the second decision changes
    nothing (the victim is another notice's; the database holds one notice per victim)."""
    low, _ = running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    first, second = (
        Job.objects.select_related("priority_class").get(pk=gpu_job(pool, tenant, prod).pk)
        for _ in "ab"
    )
    now = decided_at()
    nodes = pool_snapshot(pool.pk).nodes
    request = replace(core_request(first.resources, first.tenant_id), priority=1000)
    candidates = preemption.running_candidates(pool.pk, nodes)
    choice = choose_victims(request, nodes, candidates, pool_policy(pool), now=now.timestamp())

    assert preemption._decide(first, choice, now, NOTICE_S) == "noticed"
    assert preemption._decide(second, choice, now, NOTICE_S) == ""
    assert preemption._decide(first, choice, now, NOTICE_S) == ""  # one notice per preemptor
    assert list(NoticedVictim.objects.values_list("notice__preemptor_id", "job_id")) == [
        (first.pk, low.pk)
    ]
    assert not second.events.filter(reason=Reason.PREEMPTING).exists()


@pytest.mark.django_db(transaction=True)
def test_two_workers_settling_at_once_carry_a_notice_out_once(pool, node_api, tenant, batch, prod):
    low, _ = running(node_api, gpu_job(pool, tenant, batch, 2, checkpointable=True))
    high = gpu_job(pool, tenant, prod)
    t0 = decided_at()
    scheduling_pass(pool_id=pool.pk, now=t0)
    barrier, outcomes, errors = threading.Barrier(2), [], []

    def settle():
        try:
            barrier.wait()
            outcomes.append(preemption.settle(pool.pk, now=after(t0, NOTICE_S)))
        except Exception as exc:  # surfaced below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=settle) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sorted(outcomes, key=len) == [{}, {high.pk: "preempting"}]
    low.refresh_from_db()
    assert low.state == JobState.CHECKPOINTING
    assert low.events.filter(reason=Reason.PREEMPTED).count() == 1
    assert high.events.filter(reason=Reason.PREEMPTING, data__confirmed=True).count() == 1
