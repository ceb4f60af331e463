"""What the Docker runtime reads and writes of a container through the engine: its output (a
log stream), its files (tar streams of the archive API, never a host path), its usage (the
engine's stats) and its OOM kill (the engine's event log)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from docker.errors import APIError, DockerException, NotFound

from worker_agent import tarstream
from worker_agent.runtime.base import RuntimeFailure
from worker_agent.runtime.engine import moment

log = logging.getLogger(__name__)

LOG_BUFFER_MAX = 8 * 1024 * 1024  # unsent log text kept per run; the oldest is dropped first
OOM_EVENT_GRACE_S = 2.0  # how long past an exit the engine's `oom` event may still arrive


class LogFollower:
    """Follows a container's output in a thread; `take()` hands over what arrived since."""

    def __init__(self, stream):
        self._stream, self._lock = stream, threading.Lock()
        self._chunks: list[str] = []
        self._size = 0
        self._thread = threading.Thread(target=self._follow, daemon=True, name="logs")
        self._thread.start()

    def _follow(self):
        try:
            for chunk in self._stream:
                text = chunk.decode(errors="replace")
                with self._lock:
                    self._chunks.append(text)
                    self._size += len(text)
                    while self._size > LOG_BUFFER_MAX and len(self._chunks) > 1:
                        self._size -= len(self._chunks.pop(0))
        except (DockerException, OSError, ValueError) as exc:
            log.debug("log stream ended: %s", exc)

    def take(self) -> str:
        with self._lock:
            text, self._chunks, self._size = "".join(self._chunks), [], 0
        return text

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)


def read_archive(container, path: str):
    """`path` inside the container (stopped: nothing changes under it), as a tar stream read
    through the engine's archive API, its mounts included: the engine resolves the path in
    the container's own filesystem and never follows a link the job made out of it. A
    readable binary file; None when the path does not exist there."""
    try:
        chunks, _stat = container.get_archive(path, chunk_size=tarstream.CHUNK)
    except NotFound:
        return None
    except DockerException as exc:
        raise RuntimeFailure("runtime_error", f"reading {path}: {exc}") from exc
    return tarstream.reader(chunks)


def write_archive(container, path: str, chunks) -> None:
    """Unpacks the tar stream `chunks` into `path` of the created (not started) container,
    through the engine (each member owned as its header says)."""
    try:
        if not container.put_archive(path, chunks):
            raise RuntimeFailure("runtime_error", f"the engine refused the files for {path}")
    except DockerException as exc:
        raise RuntimeFailure("runtime_error", f"writing {path}: {exc}") from exc


def usage(container) -> dict:
    """CPU (millicores over the last interval), memory (MiB, without page cache) and the
    bytes its network interfaces sent since it started (`net_tx_bytes`, for the egress
    quota; a job without a network reports 0)."""
    try:
        stats = container.stats(stream=False)
    except (DockerException, ValueError):
        return {}
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    used = cpu.get("cpu_usage", {}).get("total_usage", 0) - pre.get("cpu_usage", {}).get(
        "total_usage", 0
    )
    system = cpu.get("system_cpu_usage", 0) - pre.get("system_cpu_usage", 0)
    cpus = cpu.get("online_cpus") or len(cpu.get("cpu_usage", {}).get("percpu_usage") or [1])
    memory = stats.get("memory_stats") or {}
    detail = memory.get("stats") or {}
    cache = detail.get("total_inactive_file", detail.get("inactive_file", 0))
    return {
        "cpu_millicores": int(used / system * cpus * 1000) if system > 0 and used > 0 else 0,
        "memory_mib": max(0, memory.get("usage", 0) - cache) // (1024 * 1024),
        "net_tx_bytes": sum(
            int(interface.get("tx_bytes") or 0)
            for interface in (stats.get("networks") or {}).values()
        ),
    }


def oom_event(client, container) -> bool:
    """Whether the engine logged an `oom` event for a container killed by SIGKILL. Docker's
    OOMKilled flag loses a race with the exit event on cgroup v2 (containerd #12714), so
    the engine's own event log, waited on a moment past the exit, settles it."""
    state = container.attrs["State"]
    if state.get("ExitCode") != 137 or not (started := moment(state.get("StartedAt"))):
        return False
    finished = moment(state.get("FinishedAt")) or datetime.now(UTC)
    until = max(datetime.now(UTC), finished + timedelta(seconds=OOM_EVENT_GRACE_S))
    filters = {"container": container.id, "event": "oom"}
    try:
        events = client.events(
            since=int(started.timestamp()) - 1,
            until=int(until.timestamp()) + 1,
            filters=filters,
            decode=True,
        )
        return any(True for _ in events)
    except (APIError, DockerException) as exc:
        log.warning("engine events for %s not read: %s", container.name, exc)
        return False
