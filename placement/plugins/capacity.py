"""Free capacity: CPU, memory and scratch at the request's minimum, and GPUs of an allowed model.

Which devices can take the request (memory, driver, sharing class, free room, health) is decided
with the fit, in ``placement.devices``.
"""

from __future__ import annotations

from .. import reasons as r
from ..registry import register_filter
from ..types import NodeView, Request


@register_filter(
    "gpu_model",
    reasons=(r.INSUFFICIENT_GPU, r.GPU_MODEL_MISMATCH),
    reads=("gpu_models",),
    static=True,
    never_lifted=(r.INSUFFICIENT_GPU, r.GPU_MODEL_MISMATCH),
    applies=lambda req: req.wants_gpu,
)
def gpu_model(req: Request, node: NodeView, policy) -> str | None:
    if not req.wants_gpu:
        return None
    if not node.gpu_models:
        return r.INSUFFICIENT_GPU
    if req.gpu_models and not any(model in req.gpu_models for model in node.gpu_models):
        return r.GPU_MODEL_MISMATCH
    return None


@register_filter(
    "capacity",
    reasons=(r.INSUFFICIENT_CPU, r.INSUFFICIENT_MEMORY, r.INSUFFICIENT_SCRATCH),
    reads=("free_cpu_millicores", "free_memory_mib", "free_scratch_mib"),
    static=False,
    never_lifted=(r.INSUFFICIENT_CPU, r.INSUFFICIENT_MEMORY, r.INSUFFICIENT_SCRATCH),
)
def capacity(req: Request, node: NodeView, policy) -> str | None:
    if node.free_cpu_millicores < req.cpu_millicores:
        return r.INSUFFICIENT_CPU
    if node.free_memory_mib < req.memory_mib:
        return r.INSUFFICIENT_MEMORY
    if node.free_scratch_mib < req.scratch_mib:
        return r.INSUFFICIENT_SCRATCH
    return None
