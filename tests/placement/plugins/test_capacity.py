"""Free CPU, memory and scratch; GPUs of an allowed model."""

import pytest

from placement import reasons as r
from placement.types import Request

from ..factories import cpu_node, gpu_node, refusal


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
