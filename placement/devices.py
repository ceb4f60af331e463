"""Which GPUs of a node can take one share of a request, or the reason none can.

Not a filter of the chain: the evaluation needs the devices themselves (to choose among them),
and it asks twice when the request prefers more GPU memory than its minimum.
"""

from __future__ import annotations

from . import reasons as r
from .mig import layout_starts, occupied_slices, profiles_for
from .types import EXCLUSIVE, MIG, MPS, NON_ISOLATED, GpuView, NodeView, Request


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def meets_capability(capability: str, minimum: str) -> bool:
    """Whether a device's compute capability ("8.6") is at least ``minimum`` ("8.0"), compared
    as numbers ("10.0" > "9.0"); a device that reports none meets no minimum."""
    if not minimum:
        return True
    have = _version_tuple(capability)
    return bool(have) and have >= _version_tuple(minimum)


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
        used = occupied_slices(device.mig_slices, profiles)
        return bool(profile and layout_starts(profile, used, device.mig_layout))
    if req.sharing == EXCLUSIVE or req.gpu_milli >= 1000:
        return device.is_free
    if device.free_milli < req.gpu_milli:
        return False
    return not (device.tenants and mixes_tenants(device, req, policy))


def mixes_tenants(device: GpuView, req: Request, policy) -> bool:
    if not device.tenants or (policy is not None and policy.allow_tenant_mixing):
        return False
    return any(t != req.tenant for t in device.tenants)


def mps_memory_mib(device_memory_mib: int, milli: int) -> int:
    """The GPU memory an MPS share of `milli` thousandths holds on a device of
    `device_memory_mib`: the same fraction of its memory as of its compute, so the shares the
    ledger lets onto one device (their milli sum at most 1000) never promise more memory than
    it has. The one definition: placement compares `gpu_memory_mib` with it, and the agent caps
    the job's client at it (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, jobs/assignments.py)."""
    return max(0, int(device_memory_mib)) * max(0, min(1000, int(milli))) // 1000


def mps_thread_percentage(milli: int) -> int:
    """An MPS share's compute: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, milli / 10, at least 1."""
    return max(1, min(100, int(milli) // 10))


def usable_memory_mib(device: GpuView, req: Request) -> int:
    """GPU memory the request would see on ``device``: a MIG slice has its profile's memory
    (memory-isolated), an MPS share its fraction of the device's (`mps_memory_mib`, the limit
    its client gets), not the device's; anything else (a time-slice share among them, which
    reserves no memory) sees the whole device."""
    if req.sharing == MIG:
        profile = profiles_for(device.model, device.memory_mib).get(req.mig_profile)
        return profile.memory_mib if profile else 0
    if req.sharing == MPS and req.gpu_milli < 1000:
        return mps_memory_mib(device.memory_mib, req.gpu_milli)
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
    if req.min_compute_capability:
        devices = [
            g for g in devices if meets_capability(g.compute_capability, req.min_compute_capability)
        ]
        if not devices:
            return r.GPU_COMPUTE_CAPABILITY_TOO_LOW
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
    if len(fitting) >= needed:
        return r.DEVICE_UNHEALTHY
    if req.sharing in NON_ISOLATED and req.gpu_milli < 1000:
        ignoring_tenants = [g for g in devices if g.free_milli >= req.gpu_milli]
        if len(ignoring_tenants) >= needed:
            return r.TENANT_MIXING_REFUSED
    return r.INSUFFICIENT_GPU
