"""GPU inventory and health read through NVML (`nvidia-ml-py`, imported as `pynvml`).

`read_gpus(nvml)` is the one code path: it takes an object exposing the pynvml functions it
calls. On a node that object is the real `pynvml` module (`load_nvml()`); in tests it is a
`RecordedNvml` that answers the same calls from a recorded device set
(tests/worker_agent/fixtures/nvml_*.json, written by `record(nvml)` on a real machine with
`python -m worker_agent.inventory record > nvml_<name>.json`).

The result has two parts: the inventory (what scheduling needs, registered at enrollment and
reconciled later) and per-device health readings (sent with heartbeats).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import sys
from types import SimpleNamespace

import pynvml

from worker_agent.nvml_health import NVLINK_COUNTERS, device_health
from worker_agent.schema import GPU_KEYS, SCHEMA_VERSION, storage_errors, validate_inventory

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def load_nvml():
    """The real NVML, initialised; raises pynvml.NVMLError when no driver is present."""
    pynvml.nvmlInit()
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call, *args):
    """An NVML reading that a device may not support: None instead of an error."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def _cuda_version(nvml) -> str:
    version = _optional(nvml.nvmlSystemGetCudaDriverVersion_v2)
    if not version:
        return ""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _compute_capability(nvml, handle) -> str:
    """The device's CUDA compute capability as "major.minor" ("9.0" for an H100); "" when the
    driver does not say."""
    version = _optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    if not version or len(version) != 2:
        return ""
    major, minor = version
    return f"{int(major)}.{int(minor)}"


PROFILE_NAME = re.compile(r"(\d+g\.\d+gb(?:\+me)?)")


def mig_profile_name(text) -> str:
    """ "3g.40gb" out of a MIG device's or a GPU instance profile's name ("NVIDIA H100 80GB
    HBM3 MIG 3g.40gb", "MIG 3g.40gb"); the text itself when it names none."""
    text = _text(text)
    match = PROFILE_NAME.search(text)
    return match.group(1) if match else text


def gpu_instance_info(nvml, parent, mig):
    """NVML's info of the GPU instance a MIG device belongs to (its id, profile id and
    placement), or None where the driver does not say (it needs a privileged agent)."""
    instance = _optional(nvml.nvmlDeviceGetGpuInstanceId, mig)
    if instance is None:
        return None
    gpu_instance = _optional(nvml.nvmlDeviceGetGpuInstanceById, parent, instance)
    if gpu_instance is None:
        return None
    return _optional(nvml.nvmlGpuInstanceGetInfo, gpu_instance)


def _mig_slices(nvml, handle) -> list[dict]:
    """The MIG instances carved on a device as NVML lists them: the real layout the scheduler
    places on (`start`: the GPU instance's first memory slice, where the driver says)."""
    slices = []
    count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for i in range(count):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if mig is None:
            continue
        name = _text(nvml.nvmlDeviceGetName(mig))
        item = {
            "profile": mig_profile_name(name),
            "uuid": _text(nvml.nvmlDeviceGetUUID(mig)),
            "memory_mib": nvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024),
            "gpu_instance_id": _optional(nvml.nvmlDeviceGetGpuInstanceId, mig),
        }
        info = gpu_instance_info(nvml, handle, mig)
        if info is not None:
            item["start"] = int(info.placement.start)
        slices.append(item)
    return slices


def _nvlink_peers(nvml, handle) -> tuple[set[str], int]:
    """Bus ids at the far end of active NVLinks, and how many supported links are down."""
    peers, down = set(), 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            break  # no more links on this device (or no NVLink at all)
        if state == nvml.NVML_FEATURE_ENABLED:
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is not None:
                peers.add(_text(remote.busId).lower())
        else:
            down += 1
    return peers, down


def _interconnect_groups(links: dict[str, set[str]]) -> dict[str, str]:
    """bus id → group name: GPUs joined by NVLink (directly or through one NVSwitch)."""
    parent = {bus: bus for bus in links}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owners: dict[str, str] = {}
    for bus, peers in links.items():
        for peer in peers:
            if peer in parent:
                parent[find(peer)] = find(bus)
            elif peer in owners:  # a switch both GPUs reach
                parent[find(owners[peer])] = find(bus)
            else:
                owners[peer] = bus
    roots = sorted({find(bus) for bus, peers in links.items() if peers})
    names = {root: f"nvl{i}" for i, root in enumerate(roots)}
    return {bus: names.get(find(bus), "") if links[bus] else "" for bus in links}


def read_gpus(nvml, xids: dict | None = None) -> dict:
    """{"gpus": [inventory per device], "health": [readings per device]} through `nvml`;
    `xids`: the Xid events seen since the last reading by UUID (nvml_health.XidWatcher)."""
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = _cuda_version(nvml)
    gpus, health, links = [], [], {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId).lower()
        mig_mode = _optional(nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mig_mode and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE)
        peers, down = _nvlink_peers(nvml, handle)
        links[bus] = peers
        gpu = {
            "index": index,
            "uuid": uuid,
            "model": _text(nvml.nvmlDeviceGetName(handle)),
            "memory_mib": nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
            "driver_version": driver,
            "cuda_version": cuda,
            "mig_enabled": mig_enabled,
            "mig_slices": _mig_slices(nvml, handle) if mig_enabled else [],
            "numa_node": _optional(nvml.nvmlDeviceGetNumaNodeId, handle),
            "_bus": bus,
        }
        if capability := _compute_capability(nvml, handle):  # optional in the schema
            gpu["compute_capability"] = capability
        gpus.append(gpu)
        ecc = _optional(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        health.append(
            {
                "uuid": uuid,
                "temperature_c": _optional(
                    nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
                ),
                "slowdown_temperature_c": _optional(
                    nvml.nvmlDeviceGetTemperatureThreshold,
                    handle,
                    nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                ),
                "pcie_link_width": _optional(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
                "pcie_link_width_max": _optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                "ecc_errors_uncorrected": ecc or 0,
                "nvlink_down": down if peers else 0,
            }
            | device_health(nvml, handle)
            | ({"xids": list(xids[uuid])} if xids and xids.get(uuid) else {})
        )
    groups = _interconnect_groups(links)
    for gpu in gpus:
        gpu["interconnect_group"] = groups[gpu.pop("_bus")]
    return {"gpus": gpus, "health": health}


def mig_device(nvml, identifier: str):
    """The NVML handle of a lease's MIG instance. `MIG-<GPU UUID>/<first slot>/<ci>` (the
    control plane's name, docs/data-plane.md) is the MIG device of the GPU instance placed at
    that slot of that GPU; a plain MIG device UUID (`MIG-<uuid>`) is looked up as it is. None
    when it is not there (or the driver does not say where its instances are placed: that
    needs a privileged agent)."""
    name, _, rest = str(identifier).removeprefix("MIG-").partition("/")
    if not rest:
        return _optional(nvml.nvmlDeviceGetHandleByUUID, str(identifier))
    slot = rest.partition("/")[0]
    if not slot.isdigit():
        return None
    parent = _optional(nvml.nvmlDeviceGetHandleByUUID, name)
    if parent is None:
        return None
    for index in range(_optional(nvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 0):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent, index)
        if mig is None:
            continue
        info = gpu_instance_info(nvml, parent, mig)
        if info is not None and int(info.placement.start) == int(slot):
            return mig
    return None


def container_device_ids(nvml, identifiers) -> list[str]:
    """The device IDs the NVIDIA runtime understands for a lease's devices: whole GPUs by their
    UUID as they are; the control plane's `MIG-<GPU UUID>/<slot>/<ci>` as the UUID of the MIG
    device placed at that slot — handed on as written, the runtime would read the slot as a GPU
    instance ID and could give the job another tenant's slice. Raises LookupError naming an
    instance that cannot be found (no NVML, not on this node, placement unknown)."""
    ids = []
    for identifier in identifiers:
        identifier = str(identifier)
        if not identifier.startswith("MIG-") or "/" not in identifier:
            ids.append(identifier)
            continue
        handle = mig_device(nvml, identifier) if nvml is not None else None
        uuid = _optional(nvml.nvmlDeviceGetUUID, handle) if handle is not None else None
        if not uuid:
            raise LookupError(f"MIG instance {identifier} is not found on this node")
        ids.append(_text(uuid))
    return ids


def gpu_usage(nvml, uuids) -> dict:
    """What a lease's devices are doing now: `gpu_utilization_percent` (the mean over the
    whole devices that report it) and `gpu_memory_mib` (used, summed over devices and MIG
    instances). {} without a driver, without devices, or when none of them answers. A MIG
    instance (`MIG-…`) gives its memory only: NVML has no utilisation per instance on most
    drivers (it answers NotSupported), so a lease of MIG instances reports no utilisation."""
    if nvml is None:
        return {}
    rates, memory, seen, whole = [], 0, 0, 0
    for uuid in uuids or ():
        mig = str(uuid).startswith("MIG-")
        if mig:
            handle = mig_device(nvml, str(uuid))
        else:
            handle = _optional(nvml.nvmlDeviceGetHandleByUUID, str(uuid))
        if handle is None:
            continue
        info = _optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        if info is not None:
            memory += int(info.used) // (1024 * 1024)
        seen += 1
        if mig:
            continue
        whole += 1
        rate = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        if rate is not None:
            rates.append(int(rate.gpu))
    if not seen:
        return {}
    usage = {"gpu_memory_mib": memory}
    if whole:
        usage["gpu_utilization_percent"] = round(sum(rates) / len(rates), 1) if rates else 0
    return usage


# --------------------------------------------------------------------------- recordings


class RecordedNvml:
    """Answers the pynvml calls `read_gpus` makes from a recorded device set.

    Missing readings raise pynvml's own NotSupported error, as a real device would.
    """

    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, recording: dict):
        self.system = recording["system"]
        self.devices = recording["devices"]

    @classmethod
    def from_file(cls, path) -> RecordedNvml:
        with open(path) as f:
            return cls(json.load(f))

    @staticmethod
    def _get(device: dict, key: str):
        value = device.get(key)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # system
    def nvmlSystemGetDriverVersion(self):
        return self.system["driver_version"]

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.system["cuda_driver_version"]

    # devices: a handle is the recorded device dict itself
    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for device in self.devices:
            for candidate in (device, *(m for m in device.get("mig_devices") or () if m)):
                if candidate["uuid"] == uuid:
                    return candidate
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["memory_total_bytes"], used=h.get("memory_used_bytes", 0))

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._get(h, "utilization_gpu_percent"), memory=0)

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["pci_bus_id"])

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(self._get(h, "cuda_compute_capability"))

    def nvmlDeviceGetMigMode(self, h):
        return self._get(h, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return self._get(h, "max_mig_device_count")

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        slots = h.get("mig_devices") or []
        if i >= len(slots) or slots[i] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[i]

    def nvmlDeviceGetGpuInstanceId(self, h):
        return self._get(h, "gpu_instance_id")

    def nvmlDeviceGetGpuInstanceById(self, h, instance):
        # a GPU instance handle is its MIG device's recorded dict (one compute instance each)
        for mig in h.get("mig_devices") or ():
            if mig and mig.get("gpu_instance_id") == instance:
                return mig
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gi):
        placement = SimpleNamespace(
            start=self._get(gi, "placement_start"), size=gi.get("placement_size") or 0
        )
        return SimpleNamespace(
            id=gi["gpu_instance_id"], profileId=gi.get("profile_id"), placement=placement
        )

    def nvmlDeviceGetComputeInstanceId(self, h):
        return self._get(h, "compute_instance_id")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, profile, version=2):
        # the device's table of GPU instance profiles, by NVML's profile enum (recorded as is)
        for info in h.get("gpu_instance_profiles") or ():
            if info["nvml_profile"] == profile:
                return SimpleNamespace(
                    id=info["id"],
                    name=info["name"],
                    sliceCount=info["slice_count"],
                    memorySizeMB=info["memory_size_mb"],
                    instanceCount=info.get("instance_count", 0),
                )
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # health: ECC, retirement, throttle reasons, NVLink counters, Xid events
    def nvmlDeviceGetRetiredPages_v2(self, h, cause):
        key = (
            "retired_pages_dbe"
            if cause == self.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            else "retired_pages_sbe"
        )
        return list(self._get(h, key))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._get(h, "retired_pages_pending")

    def nvmlDeviceGetRemappedRows(self, h):
        return tuple(self._get(h, "remapped_rows"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get(h, "clocks_event_reasons")

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        errors = (h.get("nvlinks") or [])[link].get("errors") or {}
        names = {v: k for k, v in NVLINK_COUNTERS.items()}
        return self._get(errors, names.get(counter, ""))

    def nvmlEventSetCreate(self):
        return SimpleNamespace(pending=[])

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        # the device's recorded Xids are the events queued once it is registered
        for xid in self._get(h, "xid_events"):
            event_set.pending.append(
                SimpleNamespace(
                    device=h, eventType=types, eventData=xid, gpuInstanceId=0, computeInstanceId=0
                )
            )

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not event_set.pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return event_set.pending.pop(0)

    def nvmlEventSetFree(self, event_set):
        event_set.pending.clear()

    def nvmlDeviceGetNumaNodeId(self, h):
        return self._get(h, "numa_node_id")

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._get(h, "temperature_c")

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return self._get(h, "slowdown_temperature_c")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._get(h, "pcie_link_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._get(h, "pcie_link_width_max")

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        what = "corrected" if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        when = "aggregate" if counter == self.NVML_AGGREGATE_ECC else "volatile"
        return self._get(h, f"ecc_{what}_{when}")

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = h.get("nvlinks") or []
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if links[link]["active"] else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=h["nvlinks"][link]["remote_bus_id"])


def _record_retirement(nvml, handle) -> dict:
    pages = {}
    for key, cause in (
        ("retired_pages_sbe", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("retired_pages_dbe", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ):
        found = _optional(nvml.nvmlDeviceGetRetiredPages_v2, handle, cause)
        pages[key] = [{k: int(v) for k, v in p.items()} for p in found] if found else found
    rows = _optional(nvml.nvmlDeviceGetRemappedRows, handle)
    return pages | {
        "retired_pages_pending": _optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        "remapped_rows": [int(v) for v in rows] if rows is not None else None,
    }


def _record_profiles(nvml, handle) -> list[dict] | None:
    """The device's GPU instance profiles (MIG-capable devices), by NVML's profile enum."""
    table = []
    for profile in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _optional(nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
        if info is None:
            continue
        table.append(
            {
                "nvml_profile": profile,
                "id": int(info.id),
                "name": _text(info.name),
                "slice_count": int(info.sliceCount),
                "memory_size_mb": int(info.memorySizeMB),
                "instance_count": int(info.instanceCount),
            }
        )
    return table or None


def record(nvml) -> dict:
    """Write down what a real NVML answers, in the form RecordedNvml replays."""

    def device(handle, *, parent=None) -> dict:
        data = {
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "memory_total_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).total,
        }
        if parent is not None:  # a MIG device: its GPU instance and where that is placed
            instance = _optional(nvml.nvmlDeviceGetGpuInstanceId, handle)
            gpu_instance = None
            if instance is not None:
                gpu_instance = _optional(nvml.nvmlDeviceGetGpuInstanceById, parent, instance)
            info = None
            if gpu_instance is not None:
                info = _optional(nvml.nvmlGpuInstanceGetInfo, gpu_instance)
            data |= {
                "gpu_instance_id": instance,
                "compute_instance_id": _optional(nvml.nvmlDeviceGetComputeInstanceId, handle),
                "placement_start": int(info.placement.start) if info else None,
                "placement_size": int(info.placement.size) if info else None,
                "profile_id": int(info.profileId) if info else None,
                "memory_used_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).used,
            }
            return data
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError:
                break
            remote = _optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            links.append(
                {
                    "active": state == nvml.NVML_FEATURE_ENABLED,
                    "remote_bus_id": _text(remote.busId) if remote else "",
                    "errors": {
                        name: _optional(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, c)
                        for name, c in NVLINK_COUNTERS.items()
                    },
                }
            )
        mig_count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        capability = _optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)  # (major, minor)
        data |= {
            "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            "cuda_compute_capability": list(capability) if capability is not None else None,
            "mig_mode": _optional(nvml.nvmlDeviceGetMigMode, handle),
            "max_mig_device_count": mig_count,
            "mig_devices": [
                (lambda m: device(m, parent=handle) if m is not None else None)(
                    _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
                )
                for i in range(mig_count or 0)
            ],
            "numa_node_id": _optional(nvml.nvmlDeviceGetNumaNodeId, handle),
            "temperature_c": _optional(
                nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "slowdown_temperature_c": _optional(
                nvml.nvmlDeviceGetTemperatureThreshold,
                handle,
                nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
            ),
            "pcie_link_width": _optional(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
            "pcie_link_width_max": _optional(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
            "memory_used_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).used,
            "utilization_gpu_percent": getattr(
                _optional(nvml.nvmlDeviceGetUtilizationRates, handle), "gpu", None
            ),
            **{
                f"ecc_{what}_{when}": _optional(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, c)
                for what, kind in (
                    ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                    ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                )
                for when, c in (
                    ("volatile", nvml.NVML_VOLATILE_ECC),
                    ("aggregate", nvml.NVML_AGGREGATE_ECC),
                )
            },
            **_record_retirement(nvml, handle),
            "clocks_event_reasons": _optional(
                getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons,
                handle,
            ),
            "gpu_instance_profiles": _record_profiles(nvml, handle),
            # Xids queued while recording (none on a healthy machine), replayed as events
            "xid_events": [],
            "nvlinks": links,
        }
        return data

    return {
        "system": {
            "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": _optional(nvml.nvmlSystemGetCudaDriverVersion_v2),
        },
        "devices": [
            device(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
        ],
    }


def inventory_only(reading: dict) -> list[dict]:
    """The per-GPU inventory part, in the keys the inventory schema defines."""
    return [{k: gpu[k] for k in GPU_KEYS if k in gpu} for gpu in reading["gpus"]]


def inventory_document(
    reading: dict, *, cpu_millicores: int, memory_mib: int, scratch_mib: int = 0, numa=()
) -> dict:
    """The inventory the agent sends (enrollment, reports), checked against the schema first:
    a node never sends what the control plane would refuse. Raises InventoryInvalid."""
    return validate_inventory(
        {
            "schema_version": SCHEMA_VERSION,
            "cpu_millicores": cpu_millicores,
            "memory_mib": memory_mib,
            "scratch_mib": scratch_mib,
            "numa": list(numa),
            "gpus": inventory_only(reading),
        }
    )


# --------------------------------------------------------------------------- the disk


def disk_capacity_mib(path) -> int:
    """The size of the filesystem that holds `path`, in MiB: the inventory's `scratch_mib`
    (what the node has; what is free now goes with each heartbeat, `disk_report`)."""
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize // MIB


def held_bytes(root, *, depth: int = 3) -> int:
    """What the node's reservations have already written on the filesystem of `root` (the work
    root): the allocated blocks of the disk images below it (`*.img`: jobs' scratch and
    outputs, volumes), those of another filesystem left out. A sparse image counts what its
    job wrote, never its size."""
    try:
        device = os.stat(root).st_dev
    except OSError:
        return 0
    total, stack = 0, [(os.fspath(root), 0)]
    while stack:
        folder, level = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_dev != device:
                continue
            if stat.S_ISDIR(info.st_mode) and level < depth:
                stack.append((entry.path, level + 1))
            elif stat.S_ISREG(info.st_mode) and entry.name.endswith(".img"):
                total += min(info.st_blocks * 512, info.st_size)
    return total


def disk_report(root) -> dict:
    """The heartbeat's `disk` (worker_agent/schemas/storage-v1.json): statvfs of the work
    root's filesystem — its size and what is free to the agent — and what the node's
    reservations already wrote there (`held_bytes`)."""
    stats = os.statvfs(root)
    total = stats.f_blocks * stats.f_frsize
    free = min(stats.f_bavail * stats.f_frsize, total)
    return {"total_bytes": total, "free_bytes": free, "held_bytes": min(held_bytes(root), total)}


def storage_report(*, root, image_sizes: dict, cache=None) -> dict:
    """The heartbeat's storage parts (`disk`, `cache`, `downloads`), checked against the schema
    first: a part the control plane would refuse is left out (and logged), never sent."""
    report = {"disk": disk_report(root)}
    images = [{"digest": d, "bytes": int(b)} for d, b in list(image_sizes.items())[:512]]
    report["cache"] = {"images": images, "inputs": cache.report() if cache else []}
    if cache is not None:
        downloads = cache.take_downloads()
        if downloads:
            report["downloads"] = downloads
    for part in list(report):
        problems = storage_errors({part: report[part]})
        if problems:
            log.warning("storage report: %s left out: %s", part, problems[:3])
            del report[part]
    return report


if __name__ == "__main__":  # pragma: no cover - run on a GPU machine
    nvml = load_nvml()
    try:
        if sys.argv[1:] == ["record"]:
            json.dump(record(nvml), sys.stdout, indent=2)
        else:
            json.dump(read_gpus(nvml), sys.stdout, indent=2)
    finally:
        nvml.nvmlShutdown()
