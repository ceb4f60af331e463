"""What this host has, as the inventory the control plane schedules on: CPU (millicores),
memory, scratch disk, NUMA nodes, architecture and OS through psutil and /sys; GPUs through the
NVML reader in `inventory.py`. Where no NVIDIA driver answers, the node reports no GPUs and the
agent logs why (`Host.gpu_note`). The document is checked against the inventory schema before
it is sent: the agent never sends what the control plane would refuse."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
from pathlib import Path

import psutil
import pynvml

from worker_agent.inventory import (
    disk_capacity_mib,
    gpu_usage,
    inventory_document,
    load_nvml,
    read_gpus,
)
from worker_agent.nvml_health import XidWatcher
from worker_agent.schema import checked_gpu_health

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
NUMA_ROOT = Path("/sys/devices/system/node")


def architecture() -> str:
    machine = platform.machine().lower()
    return ARCHITECTURES.get(machine, machine or "amd64")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' → [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def numa_nodes(root: Path = NUMA_ROOT) -> list[dict]:
    """One entry per NUMA node the kernel shows: id, its CPU ids, its memory; [] if unknown."""
    nodes = []
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = parse_cpulist((path / "cpulist").read_text())
            meminfo = (path / "meminfo").read_text()
        except (OSError, ValueError):
            continue
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        entry = {"id": int(path.name[4:]), "cpus": cpus[:16384]}
        if match:
            entry["memory_mib"] = int(match.group(1)) // 1024
        nodes.append(entry)
    return nodes[:256]


# The CPU flags a job may require (`node_features_required`): instruction sets that decide
# whether a binary runs at all or how fast (x86's vector and matrix units, arm's SVE), and
# hardware virtualisation. The kernel lists them in /proc/cpuinfo ("flags", arm: "Features").
CPU_FEATURES = frozenset(
    {
        "sse4_2", "avx", "avx2", "fma", "aes", "sha_ni", "avx512f", "avx512bw", "avx512vl",
        "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
        "vmx", "svm", "asimd", "sve", "sve2", "sha3", "sm4",
    }
)  # fmt: skip
CPUINFO = Path("/proc/cpuinfo")


def cpu_features(cpuinfo: Path = CPUINFO) -> list[str]:
    """The CPU_FEATURES this host's first CPU lists, sorted; [] when the kernel does not say."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
    return sorted(CPU_FEATURES.intersection(match.group(1).split())) if match else []


class Host:
    """The host's resources; NVML stays initialised for the agent's life when a driver exists."""

    def __init__(self, scratch_path: str | os.PathLike = "/"):
        self.scratch_path = str(scratch_path)
        self.nvml = None
        self.xid_watcher = None
        self.gpu_note = ""
        try:
            self.nvml = load_nvml()
        except pynvml.NVMLError as exc:  # no driver, no library, no device: no GPUs
            self.gpu_note = f"no GPUs reported: NVML unavailable ({exc})"
            log.info("%s", self.gpu_note)

    def gpu_reading(self, xids: dict | None = None) -> dict:
        if self.nvml is None:
            return {"gpus": [], "health": []}
        try:
            return read_gpus(self.nvml, xids=xids)
        except pynvml.NVMLError as exc:
            self.gpu_note = f"GPU reading failed: {exc}"
            log.warning("%s", self.gpu_note)
            return {"gpus": [], "health": []}

    def inventory(self) -> dict:
        """The schema-checked inventory (raises worker_agent.schema.InventoryInvalid)."""
        cpus = psutil.cpu_count(logical=True) or 1
        with contextlib.suppress(AttributeError, OSError):
            cpus = len(os.sched_getaffinity(0))  # what this agent may actually use
        return inventory_document(
            self.gpu_reading(),
            cpu_millicores=cpus * 1000,
            memory_mib=psutil.virtual_memory().total // MIB,
            # the size of the work root's disk; what is free of it goes with each heartbeat
            # (docs/storage.md "Scratch on disk")
            scratch_mib=disk_capacity_mib(self.scratch_path),
            numa=numa_nodes(),
        )

    def gpu_health(self) -> list[dict]:
        """Per-device readings for heartbeats, with the Xid events NVML queued since the last
        one (worker_agent.nvml_health.XidWatcher; read here only, so none is reported twice)."""
        xids = {}
        if self.nvml is not None:
            if self.xid_watcher is None:
                self.xid_watcher = XidWatcher(self.nvml)
            try:
                xids = self.xid_watcher.take()
            except pynvml.NVMLError as exc:
                log.debug("Xid events not read: %s", exc)
        readings = (checked_gpu_health(r) for r in self.gpu_reading(xids=xids)["health"])
        return [r for r in readings if r is not None]

    def gpu_usage(self, uuids) -> dict:
        """A lease's devices now (NVML), for its workload's usage; {} without a driver."""
        try:
            return gpu_usage(self.nvml, uuids)
        except pynvml.NVMLError as exc:
            log.debug("GPU usage not read: %s", exc)
            return {}

    def usage(self) -> dict:
        """The whole host's usage now, for heartbeats (numbers only)."""
        memory = psutil.virtual_memory()
        return {
            "cpu_percent": psutil.cpu_percent(interval=None),
            "memory_used_mib": (memory.total - memory.available) // MIB,
            "load_1m": os.getloadavg()[0],
        }

    def describe(self) -> dict:
        """Enrollment fields beside the inventory."""
        return {
            "architecture": architecture(),
            "os": platform.system().lower() or "linux",
            "features": cpu_features(),
        }

    def close(self) -> None:
        if self.xid_watcher is not None:
            self.xid_watcher.close()
            self.xid_watcher = None
        if self.nvml is not None:
            with contextlib.suppress(pynvml.NVMLError):
                self.nvml.nvmlShutdown()
            self.nvml = None
