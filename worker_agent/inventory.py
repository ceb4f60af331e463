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
import re
import sys
from types import SimpleNamespace

import pynvml

from worker_agent.schema import GPU_KEYS, SCHEMA_VERSION, validate_inventory


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


def _mig_slices(nvml, handle) -> list[dict]:
    slices = []
    count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for i in range(count):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
        if mig is None:
            continue
        name = _text(nvml.nvmlDeviceGetName(mig))
        match = re.search(r"(\d+g\.\d+gb)", name)
        slices.append(
            {
                "profile": match.group(1) if match else name,
                "uuid": _text(nvml.nvmlDeviceGetUUID(mig)),
                "memory_mib": nvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024),
                "gpu_instance_id": _optional(nvml.nvmlDeviceGetGpuInstanceId, mig),
            }
        )
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


def read_gpus(nvml) -> dict:
    """{"gpus": [inventory per device], "health": [readings per device]} through `nvml`."""
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
        gpus.append(
            {
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
        )
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
        )
    groups = _interconnect_groups(links)
    for gpu in gpus:
        gpu["interconnect_group"] = groups[gpu.pop("_bus")]
    return {"gpus": gpus, "health": health}


def gpu_usage(nvml, uuids) -> dict:
    """What a lease's devices are doing now: `gpu_utilization_percent` (the mean over the
    devices that report it) and `gpu_memory_mib` (used, summed). {} without a driver, without
    devices, or when none of them answers. MIG instances (`MIG-…`) are not sampled: NVML gives
    no utilisation per instance."""
    if nvml is None:
        return {}
    rates, memory, seen = [], 0, 0
    for uuid in uuids or ():
        if str(uuid).startswith("MIG-"):
            continue
        handle = _optional(nvml.nvmlDeviceGetHandleByUUID, str(uuid))
        if handle is None:
            continue
        info = _optional(nvml.nvmlDeviceGetMemoryInfo, handle)
        if info is not None:
            memory += int(info.used) // (1024 * 1024)
        rate = _optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        if rate is not None:
            rates.append(int(rate.gpu))
        seen += 1
    if not seen:
        return {}
    mean = round(sum(rates) / len(rates), 1) if rates else 0
    return {"gpu_utilization_percent": mean, "gpu_memory_mib": memory}


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
            if device["uuid"] == uuid:
                return device
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["memory_total_bytes"], used=h.get("memory_used_bytes", 0))

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._get(h, "utilization_gpu_percent"), memory=0)

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=h["pci_bus_id"])

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
        return self._get(h, "ecc_uncorrected_volatile")

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = h.get("nvlinks") or []
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if links[link]["active"] else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=h["nvlinks"][link]["remote_bus_id"])


def record(nvml) -> dict:
    """Write down what a real NVML answers, in the form RecordedNvml replays."""

    def device(handle, *, mig: bool = False) -> dict:
        data = {
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "memory_total_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).total,
        }
        if mig:
            data["gpu_instance_id"] = _optional(nvml.nvmlDeviceGetGpuInstanceId, handle)
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
                }
            )
        mig_count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        data |= {
            "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            "mig_mode": _optional(nvml.nvmlDeviceGetMigMode, handle),
            "max_mig_device_count": mig_count,
            "mig_devices": [
                (lambda m: device(m, mig=True) if m is not None else None)(
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
            "ecc_uncorrected_volatile": _optional(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
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


if __name__ == "__main__":  # pragma: no cover - run on a GPU machine
    nvml = load_nvml()
    try:
        if sys.argv[1:] == ["record"]:
            json.dump(record(nvml), sys.stdout, indent=2)
        else:
            json.dump(read_gpus(nvml), sys.stdout, indent=2)
    finally:
        nvml.nvmlShutdown()
