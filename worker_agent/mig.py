"""MIG instances verified, not believed, and (opt-in, unverified on hardware) carved anew.

**The check before start.** A lease names a MIG slice as `MIG-<GPU UUID>/<first slot>/<ci>`
and, in the assignment's `limits.mig_profiles`, the profile it leased there ("3g.40gb").
Before any container is created, `checked_device_ids` reads through NVML the MIG device whose
GPU instance is placed at that slot and compares its profile (the GPU instance's profile as
NVML names it, else the MIG device's name) with the leased one; a missing instance or another
profile refuses the attempt with `mig_profile_mismatch` (worker_agent.runtime.docker), and
nothing is created. What passes is handed to the NVIDIA runtime as the MIG device's UUID.

**Reconfiguration** (`apply_layout`). A pool with the knob `mig_reconfiguration` may ask, in
the heartbeat answer's `mig_layouts`, for another layout of an idle GPU
([{"gpu": UUID, "layout": [{"profile", "start"}]}]). The agent refuses unless it runs as root,
MIG mode is on, and no container of its own holds one of the GPU's instances; then it destroys
the GPU's compute and GPU instances and creates the asked ones at their placements
(nvmlDeviceCreateGpuInstanceWithPlacement, then one compute instance of the full GPU
instance), and reports the new inventory. UNVERIFIED ON HARDWARE: the call sequence is tested
against a fake NVML that records calls (tests/worker_agent/test_mig.py), never on a GPU.
"""

from __future__ import annotations

import logging
import os

import pynvml

from worker_agent.inventory import (
    _optional,
    _text,
    gpu_instance_info,
    mig_device,
    mig_profile_name,
)

log = logging.getLogger(__name__)

MIG_PROFILE_MISMATCH = "mig_profile_mismatch"


class MigRefused(Exception):
    """An attempt or a reconfiguration refused; `reason` is the reported reason code."""

    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message
        super().__init__(f"{reason}: {message}")


# --------------------------------------------------------------------------- the profiles


def profile_table(nvml, parent) -> dict[str, tuple[int, object]]:
    """The device's GPU instance profiles by name ("3g.40gb"): (NVML profile enum, info)."""
    table = {}
    for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(nvml.nvmlDeviceGetGpuInstanceProfileInfo, parent, profile)
        if info is not None:
            table.setdefault(mig_profile_name(info.name), (profile, info))
    return table


def instance_profile(nvml, parent, mig) -> str:
    """The profile of the GPU instance a MIG device belongs to, as NVML names it: by the GPU
    instance's profile id in the device's profile table, else from the MIG device's name."""
    info = gpu_instance_info(nvml, parent, mig)
    profile_id = getattr(info, "profileId", None) if info is not None else None
    if profile_id is not None:
        for name, (_, profile) in profile_table(nvml, parent).items():
            if int(profile.id) == int(profile_id):
                return name
    return mig_profile_name(_optional(nvml.nvmlDeviceGetName, mig) or "")


def _parent(nvml, identifier: str):
    uuid = str(identifier).removeprefix("MIG-").partition("/")[0]
    return _optional(nvml.nvmlDeviceGetHandleByUUID, uuid)


def check_instance(nvml, identifier: str, profile: str) -> str:
    """The UUID of the MIG device at the identifier's slot, after checking that its GPU
    instance has the leased `profile` (and, where NVML says, the compute instance named).
    Raises MigRefused(mig_profile_mismatch) otherwise."""
    parent = _parent(nvml, identifier) if nvml is not None else None
    handle = mig_device(nvml, identifier) if parent is not None else None
    if handle is None:
        raise MigRefused(MIG_PROFILE_MISMATCH, f"no MIG instance at {identifier} on this node")
    found = instance_profile(nvml, parent, handle)
    if profile and found != profile:
        raise MigRefused(
            MIG_PROFILE_MISMATCH,
            f"the MIG instance at {identifier} is {found or 'of an unknown profile'}, "
            f"not the leased {profile}",
        )
    parts = str(identifier).split("/")
    if len(parts) == 3 and parts[2].isdigit():
        compute = _optional(nvml.nvmlDeviceGetComputeInstanceId, handle)
        if compute is not None and int(compute) != int(parts[2]):
            raise MigRefused(
                MIG_PROFILE_MISMATCH,
                f"the MIG device at {identifier} is compute instance {compute}",
            )
    uuid = _optional(nvml.nvmlDeviceGetUUID, handle)
    if not uuid:
        raise MigRefused(MIG_PROFILE_MISMATCH, f"the MIG instance at {identifier} has no UUID")
    return _text(uuid)


def checked_device_ids(nvml, identifiers, profiles: dict[str, str]) -> list[str]:
    """The container's device IDs: whole GPUs as they are, each MIG slot of the lease as the
    UUID of its MIG device once its profile is checked (`profiles`: identifier → leased
    profile; an identifier without one is checked for presence only)."""
    ids = []
    for identifier in identifiers:
        identifier = str(identifier)
        if identifier.startswith("MIG-") and "/" in identifier:
            ids.append(check_instance(nvml, identifier, profiles.get(identifier, "")))
        else:
            ids.append(identifier)
    return ids


# --------------------------------------------------------------------------- reconfiguration


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _instances(nvml, parent) -> list[tuple[object, list]]:
    """The GPU instances on the device with their compute instances, found through its MIG
    devices (each is one compute instance of one GPU instance): [(gpu instance, [compute
    instances])]. A GPU instance without any compute instance has no MIG device and is not
    found; creating over it then fails in NVML, and the reconfiguration is reported failed."""
    found: dict[int, tuple[object, list]] = {}
    for index in range(_optional(nvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 0):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent, index)
        if mig is None:
            continue
        gi_id = _optional(nvml.nvmlDeviceGetGpuInstanceId, mig)
        if gi_id is None:
            continue
        if gi_id not in found:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(parent, gi_id)
            found[gi_id] = (gpu_instance, [])
        ci_id = _optional(nvml.nvmlDeviceGetComputeInstanceId, mig)
        if ci_id is not None:
            compute = nvml.nvmlGpuInstanceGetComputeInstanceById(found[gi_id][0], ci_id)
            found[gi_id][1].append(compute)
    return list(found.values())


def validate_layout(layout, table: dict) -> list[tuple[str, int]]:
    """[(profile, start)] of a requested layout, every profile known to the device; raises
    MigRefused (`mig_layout_refused`) otherwise. Overlaps are NVML's to refuse."""
    out = []
    if not isinstance(layout, list) or len(layout) > 8:
        raise MigRefused("mig_layout_refused", "a layout is a list of at most 8 instances")
    for item in layout:
        profile = str((item or {}).get("profile", ""))[:40]
        start = (item or {}).get("start")
        if profile not in table or not isinstance(start, int) or not 0 <= start < 8:
            raise MigRefused("mig_layout_refused", f"not a placement on this GPU: {item!r:.80}")
        out.append((profile, start))
    return out


def apply_layout(nvml, gpu_uuid: str, layout, *, busy=frozenset(), is_root=_is_root) -> list[str]:
    """Carve the GPU `gpu_uuid` into `layout` ([{"profile", "start"}]). Refused (MigRefused,
    nothing touched) unless this process is root, the GPU is in MIG mode, and none of its MIG
    devices is in `busy` (the UUIDs the agent's containers hold). Returns the NVML calls made,
    for the log. UNVERIFIED ON HARDWARE."""
    if not is_root():
        raise MigRefused("mig_layout_refused", "creating MIG instances needs a root agent")
    parent = _optional(nvml.nvmlDeviceGetHandleByUUID, gpu_uuid)
    if parent is None:
        raise MigRefused("mig_layout_refused", f"GPU {gpu_uuid} is not on this node")
    mode = _optional(nvml.nvmlDeviceGetMigMode, parent)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        raise MigRefused("mig_layout_refused", f"MIG mode is off on {gpu_uuid}")
    for index in range(_optional(nvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 0):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent, index)
        uuid = _optional(nvml.nvmlDeviceGetUUID, mig) if mig is not None else None
        if uuid is not None and _text(uuid) in busy:
            raise MigRefused("mig_layout_refused", f"{gpu_uuid} has an instance in use")
    table = profile_table(nvml, parent)
    wanted = validate_layout(layout, table)
    done = []
    for gpu_instance, computes in _instances(nvml, parent):
        for compute in computes:
            nvml.nvmlComputeInstanceDestroy(compute)
            done.append("nvmlComputeInstanceDestroy")
        nvml.nvmlGpuInstanceDestroy(gpu_instance)
        done.append("nvmlGpuInstanceDestroy")
    total_mb = max(1, int(nvml.nvmlDeviceGetMemoryInfo(parent).total) // (1024 * 1024))
    for profile, start in sorted(wanted, key=lambda w: w[1]):
        _enum, info = table[profile]
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        # the placement's size is the profile's memory slices, of 8 (3g.40gb: 4 on an H100)
        placement.start = start
        placement.size = max(1, round(int(info.memorySizeMB) * 8 / total_mb))
        gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(parent, info.id, placement)
        done.append(f"nvmlDeviceCreateGpuInstanceWithPlacement({profile}@{start})")
        compute = _full_compute_profile(nvml, gpu_instance)
        nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, compute)
        done.append("nvmlGpuInstanceCreateComputeInstance")
    log.info("MIG layout of %s is now %s", gpu_uuid, wanted)
    return done


def _full_compute_profile(nvml, gpu_instance) -> int:
    """The compute instance profile id that takes the whole GPU instance (the largest one it
    supports)."""
    best = None
    for profile in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        info = _optional(
            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gpu_instance,
            profile,
            nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        if info is not None and (best is None or info.sliceCount > best.sliceCount):
            best = info
    if best is None:
        raise MigRefused("mig_layout_refused", "the GPU instance offers no compute instance")
    return int(best.id)
