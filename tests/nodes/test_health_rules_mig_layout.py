"""The control plane's side of MIG reconfiguration (nodes/services/mig.py): the guard rails of
a layout request and what the heartbeat answer carries. UNVERIFIED ON HARDWARE: the agent's
side is tested against a fake NVML (tests/worker_agent/test_mig.py)."""

import pytest

from config.builders import set_pool_knobs
from nodes.models import GpuDevice
from nodes.services.mig import MigLayoutRefused, mig_layout_request, mig_layouts_open
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.reasons import Reason
from tests.clients import client_for

TWO_HALVES = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]


@pytest.fixture
def mig_gpu(ready_node):
    node = ready_node.node
    gpu = node.gpus.order_by("index").first()
    GpuDevice.objects.filter(pk=gpu.pk).update(
        mig_enabled=True,
        model="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        mig_slices=[{"profile": "7g.80gb", "start": 0}],
    )
    gpu.refresh_from_db()
    return gpu


def allow(node):
    set_pool_knobs(node.pool, mig_reconfiguration=True)
    assert knobs_for(node.pool).mig_reconfiguration


def test_the_knob_is_off_by_default_and_then_nothing_is_asked(ready_node, mig_gpu):
    node = ready_node.node
    assert knobs_for(node.pool).mig_reconfiguration is False
    with pytest.raises(MigLayoutRefused) as refused:
        mig_layout_request(node=node, gpu=mig_gpu, layout=TWO_HALVES, actor=Actor.system("t"))
    assert refused.value.code == "mig_reconfiguration_off"
    assert mig_layouts_open(node) == []


def test_an_idle_gpu_is_asked_through_the_heartbeat_answer_until_it_reports_the_layout(
    ready_node, mig_gpu
):
    node = ready_node.node
    allow(node)
    event = mig_layout_request(
        node=node, gpu=mig_gpu, layout=TWO_HALVES, actor=Actor.system("planner")
    )
    assert event.reason == Reason.MIG_LAYOUT_REQUESTED
    answer = client_for(node=node).post("/api/v1/agent/heartbeat/", {}, format="json").json()
    assert answer["mig_layouts"] == [{"gpu": mig_gpu.uuid, "layout": TWO_HALVES}]
    # the agent carved it and reported the new inventory (reconciled): nothing more to ask
    GpuDevice.objects.filter(pk=mig_gpu.pk).update(
        mig_slices=[{"profile": "3g.40gb", "start": 4}, {"profile": "3g.40gb", "start": 0}]
    )
    assert mig_layouts_open(node) == []


def test_never_on_a_gpu_with_a_lease(ready_node, mig_gpu):
    node = ready_node.node
    allow(node)
    mig_layout_request(node=node, gpu=mig_gpu, layout=TWO_HALVES, actor=Actor.system("t"))
    GpuDevice.objects.filter(pk=mig_gpu.pk).update(mig_slots_used=0b1111)  # a lease came
    assert mig_layouts_open(node) == []  # the open request is no longer sent
    with pytest.raises(MigLayoutRefused) as refused:
        mig_layout_request(node=node, gpu=mig_gpu, layout=TWO_HALVES, actor=Actor.system("t"))
    assert refused.value.code == "gpu_in_use"


@pytest.mark.parametrize(
    ("layout", "code"),
    [
        ([{"profile": "3g.40gb", "start": 2}], "mig_layout_invalid"),  # not a valid start
        ([{"profile": "5g.50gb", "start": 0}], "mig_layout_invalid"),  # not a profile of it
        (
            [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 0}],
            "mig_layout_invalid",  # overlapping
        ),
        ([], "mig_layout_invalid"),
    ],
)
def test_a_layout_the_gpu_cannot_hold_is_refused(ready_node, mig_gpu, layout, code):
    node = ready_node.node
    allow(node)
    with pytest.raises(MigLayoutRefused) as refused:
        mig_layout_request(node=node, gpu=mig_gpu, layout=layout, actor=Actor.system("t"))
    assert refused.value.code == code


def test_a_gpu_without_mig_mode_is_refused(ready_node):
    node = ready_node.node
    allow(node)
    gpu = node.gpus.order_by("index").last()
    with pytest.raises(MigLayoutRefused) as refused:
        mig_layout_request(node=node, gpu=gpu, layout=TWO_HALVES, actor=Actor.system("t"))
    assert refused.value.code == "mig_disabled"
