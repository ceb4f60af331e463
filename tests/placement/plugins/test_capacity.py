"""Free CPU, memory and scratch; GPUs of an allowed model and compute capability."""

from dataclasses import replace

import pytest

from placement import place
from placement import reasons as r
from placement.devices import eligible_devices
from placement.types import Request

from ..factories import POLICY, cpu_node, gpu_node, refusal


@pytest.mark.parametrize(
    ("field", "amount", "reason"),
    [
        ("cpu_millicores", 64001, r.INSUFFICIENT_CPU),
        ("memory_mib", 262145, r.INSUFFICIENT_MEMORY),
        ("scratch_mib", 1_000_001, r.INSUFFICIENT_SCRATCH),
    ],
)
def test_capacity_at_the_boundary(field, amount, reason):
    node = gpu_node()
    assert refusal("capacity", Request(**{field: amount}), node) == reason
    assert refusal("capacity", Request(**{field: amount - 1}), node) is None


def test_gpu_request_on_cpu_node_is_insufficient_gpu():
    assert refusal("gpu_model", Request(gpu_count=1), cpu_node()) == r.INSUFFICIENT_GPU


def test_gpu_model_mismatch():
    req = Request(gpu_count=1, gpu_models=("H100-80GB",))
    assert refusal("gpu_model", req, gpu_node(model="A100-80GB")) == r.GPU_MODEL_MISMATCH
    assert refusal("gpu_model", req, gpu_node(model="H100-80GB")) is None


def _with_capabilities(*capabilities, models=None):
    node = gpu_node(gpus=len(capabilities))
    gpus = tuple(
        replace(g, compute_capability=c, model=(models or {}).get(g.index, g.model))
        for g, c in zip(node.gpus, capabilities, strict=True)
    )
    return replace(node, gpus=gpus)


def test_compute_capability_is_compared_as_numbers_and_unknown_meets_no_minimum():
    req = Request(gpu_count=1, min_compute_capability="9.0")
    assert refusal("gpu_compute_capability", req, _with_capabilities("10.0")) is None
    assert refusal("gpu_compute_capability", req, _with_capabilities("9.0")) is None
    for below in ("8.9", "", "7.5"):
        node = _with_capabilities(below)
        assert refusal("gpu_compute_capability", req, node) == r.GPU_COMPUTE_CAPABILITY_TOO_LOW
    # one device that meets it is enough for the filter; the fit takes only such devices
    mixed = _with_capabilities("7.5", "9.0")
    assert refusal("gpu_compute_capability", req, mixed) is None
    assert [g.index for g in eligible_devices(req, mixed, POLICY)] == [1]
    assert eligible_devices(replace(req, gpu_count=2), mixed, POLICY) == r.INSUFFICIENT_GPU


def test_compute_capability_counts_only_devices_of_an_allowed_model():
    node = _with_capabilities("9.0", "8.0", models={0: "H100-80GB"})
    req = Request(gpu_count=1, min_compute_capability="9.0", gpu_models=("A100-80GB",))
    assert refusal("gpu_compute_capability", req, node) == r.GPU_COMPUTE_CAPABILITY_TOO_LOW


def test_compute_capability_and_memory_hold_for_the_same_device():
    node = _with_capabilities("8.6", "7.5")
    node = replace(node, gpus=(replace(node.gpus[0], memory_mib=24576), node.gpus[1]))
    req = Request(gpu_count=1, gpu_memory_mib=40960, min_compute_capability="8.0")
    assert isinstance(eligible_devices(req, node, POLICY), str)  # 8.6 too small, 7.5 too old
    placed = place(req, [node, replace(_with_capabilities("7.5", "8.0"), name="ok")], POLICY)
    assert placed.node == "ok" and placed.gpu_indices == (1,)
    explained = place(req, [node], POLICY)
    assert not explained and set(explained.reasons) == {r.GPU_COMPUTE_CAPABILITY_TOO_LOW}
