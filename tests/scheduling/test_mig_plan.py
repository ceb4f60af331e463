"""The MIG layout plan in the control loop (scheduling/mig_plan.py, the beat task
scheduling.mig_layout_plan): pools with `mig_reconfiguration` on ask idle MIG GPUs for the
layouts their waiting MIG jobs need, through nodes.services.mig. On PostgreSQL, through the real
pass. UNVERIFIED ON HARDWARE: the agent's side is tested against a fake NVML
(tests/worker_agent/test_mig.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import build_node, build_pool, gpu_request, set_pool_knobs, submit_jobs
from jobs.choices import JobState
from jobs.models import Job
from leases.explain import NeverFits
from leases.models import Lease
from nodes.models import GpuDevice, NodeEvent
from nodes.services.mig import mig_layouts_open
from pools.reasons import Reason
from scheduling import mig_plan
from scheduling.passes import scheduling_pass
from scheduling.tasks import mig_layout_plan

pytestmark = pytest.mark.django_db

WHOLE = [{"profile": "7g.80gb", "start": 0}]
HALVES = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]


def mig_node(pool, name, layout=WHOLE):
    return build_node(
        pool, name, cpu=16000, memory=65536, gpus=[{"mig_enabled": True, "mig_slices": layout}]
    )


def mig_jobs(pool, tenant, profile="1g.10gb", count=1):
    shape = gpu_request("mig", count=1, mig_profile=profile, cpu=1000, memory=1024)
    return submit_jobs(
        pool,
        [{"tenant": tenant, "name": f"{profile}-{i}", "resources": shape} for i in range(count)],
    )


def later(minutes=2):
    return timezone.now() + timedelta(minutes=minutes)


def requests_of(node):
    return list(
        NodeEvent.objects.filter(node=node, reason=Reason.MIG_LAYOUT_REQUESTED).order_by("id")
    )


def report(node, layout):
    """The agent carved it and reported the new inventory (reconciled)."""
    GpuDevice.objects.filter(node=node).update(mig_slices=layout)


@pytest.fixture
def pool(lpool):
    set_pool_knobs(lpool, mig_reconfiguration=True)
    return lpool


def test_a_waiting_profile_is_asked_of_an_idle_gpu_then_placed_once_reported(pool, ltenant):
    node = mig_node(pool, "m1")
    [job] = mig_jobs(pool, ltenant)
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert "insufficient_gpu" in job.pending_reason["reasons"]  # no 1g instance is carved

    answer = mig_layout_plan.delay(later().isoformat()).get()

    gpu = node.gpus.get()
    assert answer == {pool.pk: {gpu.uuid: "requested"}}
    [event] = requests_of(node)
    assert event.actor_label == "system:mig_planner"
    assert {i["profile"] for i in event.data["layout"]} == {"1g.10gb"}
    assert mig_layouts_open(node) == [{"gpu": gpu.uuid, "layout": event.data["layout"]}]

    # the agent carved it and reported it: nothing more to ask, and the job is placed on it
    report(node, event.data["layout"])
    assert mig_layouts_open(node) == []
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.LEASED
    [allocation] = Lease.objects.get(job=job).gpu_allocations
    assert allocation["mig_profile"] == "1g.10gb"


def test_nothing_when_the_knob_is_off(lpool, ltenant):
    node = mig_node(lpool, "m1")
    # off: a profile no GPU carves never fits (422 at submit); the plan asks nothing
    with pytest.raises(NeverFits):
        mig_jobs(lpool, ltenant)
    set_pool_knobs(lpool, mig_reconfiguration=True)
    mig_jobs(lpool, ltenant)  # on: the plan may carve it, so it waits
    scheduling_pass()
    set_pool_knobs(lpool, mig_reconfiguration=False)
    assert mig_plan.mig_plan(now=later()) == {}
    assert requests_of(node) == []


def test_nothing_before_the_demand_waited_its_minimum(pool, ltenant):
    node = mig_node(pool, "m1")
    mig_jobs(pool, ltenant)
    scheduling_pass()
    assert mig_plan.mig_plan(now=timezone.now()) == {pool.pk: {}}
    assert requests_of(node) == []


def test_never_a_gpu_with_a_lease(pool, ltenant):
    busy = mig_node(pool, "busy", layout=HALVES)
    [big] = mig_jobs(pool, ltenant, "3g.40gb")
    scheduling_pass()
    big.refresh_from_db()
    assert big.state == JobState.LEASED  # one 3g of the busy GPU is leased
    mig_jobs(pool, ltenant, "1g.10gb", count=2)
    scheduling_pass()
    assert mig_plan.mig_plan(now=later()) == {pool.pk: {}}
    assert requests_of(busy) == []
    # an idle GPU elsewhere is asked instead
    idle = mig_node(pool, "idle")
    answer = mig_plan.mig_plan(now=later())
    assert answer == {pool.pk: {idle.gpus.get().uuid: "requested"}}
    assert requests_of(busy) == [] and len(requests_of(idle)) == 1


def test_no_churn_the_same_demand_twice_is_one_request(pool, ltenant):
    node = mig_node(pool, "m1")
    other = mig_node(pool, "m2")
    mig_jobs(pool, ltenant, count=2)
    scheduling_pass()
    first = mig_plan.mig_plan(now=later())
    assert list(first[pool.pk].values()) == ["requested"]  # one GPU serves both waits
    # not reported yet: neither that GPU nor another is asked again for the same demand
    assert mig_plan.mig_plan(now=later(3)) == {pool.pk: {}}
    assert len(requests_of(node)) + len(requests_of(other)) == 1
    # reported: its layout serves the demand (and it was asked recently): left alone
    asked = node if requests_of(node) else other
    report(asked, requests_of(asked)[0].data["layout"])
    assert mig_plan.mig_plan(now=later(4)) == {pool.pk: {}}
    assert mig_plan.mig_plan(now=later(60)) == {pool.pk: {}}
    assert len(requests_of(node)) + len(requests_of(other)) == 1


def test_one_bad_pool_or_node_does_not_stop_the_others(pool, ltenant, monkeypatch):
    second = build_pool("second", exact_capacity=True)
    set_pool_knobs(second, mig_reconfiguration=True)
    bad_node, good_node = mig_node(pool, "bad"), mig_node(second, "good")
    mig_jobs(pool, ltenant)
    mig_jobs(second, ltenant)
    scheduling_pass()
    real = mig_plan.mig_layout_request

    def broken_on_bad(*, node, **kwargs):
        if node.pk == bad_node.pk:
            raise RuntimeError("the node's row is corrupt")
        return real(node=node, **kwargs)

    monkeypatch.setattr(mig_plan, "mig_layout_request", broken_on_bad)
    answer = mig_plan.mig_plan(now=later())
    assert answer == {pool.pk: {}, second.pk: {good_node.gpus.get().uuid: "requested"}}
    failed = NodeEvent.objects.filter(node=bad_node, reason=Reason.SWEEP_FAILED).get()
    assert "corrupt" in failed.message
    assert requests_of(bad_node) == [] and len(requests_of(good_node)) == 1

    # a pool whose plan fails is logged and answered as an error; the others go on
    real_demand = mig_plan.mig_demand

    def broken_pool(p, now):
        if p.pk == second.pk:
            raise RuntimeError("demand unreadable")
        return real_demand(p, now)

    monkeypatch.setattr(mig_plan, "mig_layout_request", real)
    monkeypatch.setattr(mig_plan, "mig_demand", broken_pool)
    answer = mig_plan.mig_plan(now=later())
    assert "demand unreadable" in answer[second.pk]["error"]
    assert answer[pool.pk] == {bad_node.gpus.get().uuid: "requested"}


def test_a_lease_that_came_meanwhile_is_a_refusal_not_a_failure(pool, ltenant, monkeypatch):
    node = mig_node(pool, "m1")
    mig_jobs(pool, ltenant)
    scheduling_pass()
    plan_pool = mig_plan.plan_pool

    def then_a_lease(p, now, rules=mig_plan.RULES):
        planned = plan_pool(p, now, rules)
        GpuDevice.objects.filter(node=node).update(mig_slots_used=0b1)
        return planned

    monkeypatch.setattr(mig_plan, "plan_pool", then_a_lease)
    assert mig_plan.mig_plan(now=later()) == {pool.pk: {node.gpus.get().uuid: "gpu_in_use"}}
    assert requests_of(node) == []
    assert not NodeEvent.objects.filter(node=node, reason=Reason.SWEEP_FAILED).exists()
    assert Job.objects.filter(state=JobState.QUEUED).count() == 1
