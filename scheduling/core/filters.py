"""Filters: decide whether a node is eligible for a request, with one reason code when not.

Filters are split in two groups:

* ``STATIC_FILTERS`` read properties that placing work does not change (state, architecture,
  labels, region ...). A scheduling pass or a replay may evaluate them once per node.
* ``capacity_reason`` and ``eligible_devices`` read free capacity and device state.

Each filter is ``f(request, node, policy) -> reason | None``; the first failing one names the
rejection. Reasons come from ``scheduling.core.reasons``; ``node_not_schedulable`` carries the
node state, e.g. ``node_not_schedulable(draining)``.
"""

from __future__ import annotations

from . import reasons as r
from .mig import free_starts, occupied_slices, profiles_for
from .types import EXCLUSIVE, MIG, NON_ISOLATED, SCHEDULABLE_STATES, GpuView, NodeView, Request


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def node_pin(req: Request, node: NodeView, policy) -> str | None:
    return r.NODE_PIN_MISMATCH if req.node_pin and req.node_pin != node.name else None


def node_schedulable(req: Request, node: NodeView, policy) -> str | None:
    if node.state not in SCHEDULABLE_STATES:
        return f"{r.NODE_NOT_SCHEDULABLE}({node.state})"
    if not node.healthy:
        return f"{r.NODE_NOT_SCHEDULABLE}(unhealthy)"
    if not node.reachable:
        return r.NODE_UNREACHABLE
    return None


def trust_level(req: Request, node: NodeView, policy) -> str | None:
    return r.TRUST_LEVEL if node.trust_level < req.min_trust_level else None


def arch(req: Request, node: NodeView, policy) -> str | None:
    return r.ARCH_MISMATCH if req.arch and req.arch != node.arch else None


def image_arch(req: Request, node: NodeView, policy) -> str | None:
    if req.image_archs and node.arch not in req.image_archs:
        return r.IMAGE_ARCH_INCOMPATIBLE
    return None


def operating_system(req: Request, node: NodeView, policy) -> str | None:
    return r.OS_MISMATCH if req.os and req.os != node.os else None


def runtime(req: Request, node: NodeView, policy) -> str | None:
    return r.RUNTIME_UNSUPPORTED if req.runtime and req.runtime not in node.runtimes else None


def region(req: Request, node: NodeView, policy) -> str | None:
    if (req.regions and node.region not in req.regions) or (
        req.zones and node.zone not in req.zones
    ):
        return r.REGION_EXCLUDED
    return None


def network_class(req: Request, node: NodeView, policy) -> str | None:
    if req.network_class and req.network_class != node.network_class:
        return r.NETWORK_CLASS_MISMATCH
    return None


def affinity(req: Request, node: NodeView, policy) -> str | None:
    for key, value in req.affinity.items():
        if node.labels.get(key) != value:
            return r.AFFINITY_MISMATCH
    return None


def gpu_model(req: Request, node: NodeView, policy) -> str | None:
    if not req.wants_gpu:
        return None
    if not node.gpus:
        return r.INSUFFICIENT_GPU
    if req.gpu_models and not any(g.model in req.gpu_models for g in node.gpus):
        return r.GPU_MODEL_MISMATCH
    return None


STATIC_FILTERS = (
    node_pin,
    node_schedulable,
    trust_level,
    arch,
    image_arch,
    operating_system,
    runtime,
    region,
    network_class,
    affinity,
    gpu_model,
)


def static_reason(req: Request, node: NodeView, policy=None) -> str | None:
    for check in STATIC_FILTERS:
        reason = check(req, node, policy)
        if reason:
            return reason
    return None


def anti_affinity(req: Request, node: NodeView, policy) -> str | None:
    if req.anti_affinity and node.workload_labels.intersection(req.anti_affinity):
        return r.ANTI_AFFINITY
    return None


def warm_image(req: Request, node: NodeView, policy) -> str | None:
    if req.require_warm_image and req.image and req.image not in node.warm_images:
        return r.IMAGE_NOT_WARM
    return None


def capacity_reason(
    req: Request, node: NodeView, cpu: int | None = None, memory: int | None = None, scratch=None
) -> str | None:
    """CPU, memory and scratch (at the given amounts, default the request minimum)."""
    if node.free_cpu_millicores < (req.cpu_millicores if cpu is None else cpu):
        return r.INSUFFICIENT_CPU
    if node.free_memory_mib < (req.memory_mib if memory is None else memory):
        return r.INSUFFICIENT_MEMORY
    if node.free_scratch_mib < (req.scratch_mib if scratch is None else scratch):
        return r.INSUFFICIENT_SCRATCH
    return None


def device_serves(device: GpuView, req: Request) -> bool:
    """Whether the device's sharing mode can enforce the request's sharing class.

    Exclusive requests take whole devices, which a time-sliced or MPS device can also give when
    it is entirely free; fractional shares need a sharing-mode device; MIG needs MIG mode.
    """
    if req.sharing == MIG:
        return device.sharing == MIG
    if req.sharing == EXCLUSIVE or req.gpu_milli >= 1000:
        return device.sharing in (EXCLUSIVE, *NON_ISOLATED)
    return device.sharing == req.sharing


def device_fits(device: GpuView, req: Request, policy) -> bool:
    """Whether the device has room for one share of the request (any tenant rules applied)."""
    if req.sharing == MIG:
        profiles = profiles_for(device.model, device.memory_mib)
        profile = profiles.get(req.mig_profile)
        return bool(profile and free_starts(profile, occupied_slices(device.mig_slices, profiles)))
    if req.sharing == EXCLUSIVE or req.gpu_milli >= 1000:
        return device.is_free
    if device.free_milli < req.gpu_milli:
        return False
    return not (device.tenants and mixes_tenants(device, req, policy))


def mixes_tenants(device: GpuView, req: Request, policy) -> bool:
    if not device.tenants or (policy is not None and policy.allow_tenant_mixing):
        return False
    return any(t != req.tenant for t in device.tenants)


def usable_memory_mib(device: GpuView, req: Request) -> int:
    """GPU memory the request would see on ``device``: a MIG slice has its profile's memory
    (memory-isolated), not the device's; anything else sees the whole device."""
    if req.sharing == MIG:
        profile = profiles_for(device.model, device.memory_mib).get(req.mig_profile)
        return profile.memory_mib if profile else 0
    return device.memory_mib


def eligible_devices(
    req: Request, node: NodeView, policy, gpu_memory_mib: int | None = None
) -> list[GpuView] | str:
    """Devices that can each take one share of the request, or the reason none can."""
    wanted_memory = req.gpu_memory_mib if gpu_memory_mib is None else gpu_memory_mib
    needed = max(req.gpu_count, 1)
    devices = node.gpus
    if req.gpu_models:
        devices = [g for g in devices if g.model in req.gpu_models]
        if not devices:
            return r.GPU_MODEL_MISMATCH
    if wanted_memory:
        devices = [g for g in devices if usable_memory_mib(g, req) >= wanted_memory]
        if not devices:
            return r.GPU_MEMORY_TOO_SMALL
    if req.min_driver_version or req.min_cuda_version:
        devices = [
            g
            for g in devices
            if _version_tuple(g.driver_version) >= _version_tuple(req.min_driver_version)
            and _version_tuple(g.cuda_version) >= _version_tuple(req.min_cuda_version)
        ]
        if not devices:
            return r.GPU_DRIVER_TOO_OLD
    devices = [g for g in devices if device_serves(g, req)]
    if not devices:
        return r.GPU_SHARING_CLASS_UNAVAILABLE
    if req.sharing == MIG and not any(
        req.mig_profile in profiles_for(g.model, g.memory_mib) for g in devices
    ):
        return r.GPU_SHARING_CLASS_UNAVAILABLE
    fitting = [g for g in devices if device_fits(g, req, policy)]
    healthy = [g for g in fitting if g.healthy and not g.health_flags]
    if len(healthy) >= needed:
        return healthy
    return _no_devices_reason(req, devices, fitting, needed)


def _no_devices_reason(req: Request, devices, fitting, needed: int) -> str:
    healthy = [g for g in fitting if g.healthy and not g.health_flags]
    if len(healthy) >= needed:
        return healthy
    if len(fitting) >= needed:
        return r.DEVICE_UNHEALTHY
    if req.sharing in NON_ISOLATED and req.gpu_milli < 1000:
        ignoring_tenants = [g for g in devices if g.free_milli >= req.gpu_milli]
        if len(ignoring_tenants) >= needed:
            return r.TENANT_MIXING_REFUSED
    return r.INSUFFICIENT_GPU
