"""Free capacity: CPU, memory and scratch at the request's minimum, GPUs of an allowed model and
of the compute capability asked.

Which devices can take the request (memory, driver, sharing class, free room, health) is decided
with the fit, in ``placement.devices``.
"""

from __future__ import annotations

from .. import reasons as r
from ..devices import meets_capability
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
    "gpu_compute_capability",
    reasons=(r.GPU_COMPUTE_CAPABILITY_TOO_LOW,),
    reads=("gpu_models", "gpu_compute_capabilities"),
    static=True,
    never_lifted=(r.GPU_COMPUTE_CAPABILITY_TOO_LOW,),
    applies=lambda req: req.wants_gpu and bool(req.min_compute_capability),
)
def gpu_compute_capability(req: Request, node: NodeView, policy) -> str | None:
    """Refuses a node none of whose GPUs (of an allowed model) has the compute capability asked;
    which devices of the node are taken is decided with the fit (``devices``), where the
    capability, the memory and the rest must hold for the same device."""
    if not req.min_compute_capability:
        return None
    for model, capability in zip(node.gpu_models, node.gpu_compute_capabilities, strict=True):
        if req.gpu_models and model not in req.gpu_models:
            continue
        if meets_capability(capability, req.min_compute_capability):
            return None
    return r.GPU_COMPUTE_CAPABILITY_TOO_LOW


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
