"""The Docker runtime: every job in a container on the real Docker engine (Docker SDK).

Isolation, each limit taken from the lease (docs/data-plane.md, "Running a job"):
- the image only by digest (`…@sha256:<64 hex>`; anything else is refused as image_invalid);
- CPU quota (NanoCpus) and the lease's cpuset; memory with no extra swap (Memory ==
  MemorySwap); a pids limit; GPUs as the exact device UUIDs / MIG instances of the lease;
- a read-only root filesystem, /tmp a small tmpfs, /scratch a volume of the leased size
  (a size-capped tmpfs volume: RAM-backed, so it also counts against the container's memory),
  /outputs a per-attempt host directory (rw), /inputs one read-only;
- user nobody (65534:65534), every capability dropped, no-new-privileges, never privileged,
  no host namespaces (private IPC, no pid/net/uts/userns host mode), no Docker socket mounted;
- network `none`, or the bridge network `computepool` (inter-container traffic off). The egress
  allow-list is NOT enforced by the agent: a job on the pool network reaches what the host
  reaches. Enforcing it needs per-container firewall rules (DOCKER-USER chain) — not done.
Secrets are passed as environment variables at create: not in the image or the job's
listings, but visible to whoever can `docker inspect` on the node.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, LogConfig, Mount

from worker_agent.host import architecture
from worker_agent.runtime.base import (
    CHECKPOINT_SUBDIR,
    LABEL,
    Assignment,
    Ended,
    Found,
    RuntimeFailure,
)

log = logging.getLogger(__name__)

DIGEST_RE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
NOBODY = "65534:65534"
POOL_NETWORK = "computepool"
TMP_TMPFS = "rw,nosuid,nodev,size=64m"
IMAGES_MAX = 512
LOG_BUFFER_MAX = 8 * 1024 * 1024  # unsent log text kept per run; the oldest is dropped first


def check_digest(image: str) -> None:
    if not DIGEST_RE.match(image or ""):
        raise RuntimeFailure(
            "image_invalid", f"refusing {image!r}: the agent runs images by @sha256: digest only"
        )


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


class DockerRuntime:
    name = "docker"

    def __init__(self, node_name: str = "", client: docker.DockerClient | None = None):
        self.node_name = node_name
        self.client = client or docker.from_env(timeout=120)

    @staticmethod
    def available() -> bool:
        try:
            client = docker.from_env(timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except DockerException:
            return False

    # ------------------------------------------------------------------ image
    def pull(self, assignment: Assignment) -> float:
        """Make the image present locally, by digest only; seconds the pull took (0 if cached)."""
        image = assignment.image
        check_digest(image)
        started = time.monotonic()
        try:
            found = self.client.images.get(image)
            pulled = 0.0
        except ImageNotFound:
            try:
                found = self.client.images.pull(image)
            except NotFound as exc:
                raise RuntimeFailure("image_invalid", f"{image}: {exc.explanation}") from exc
            except APIError as exc:
                text = str(exc.explanation or exc)
                reason = "image_invalid" if "manifest unknown" in text else "image_pull_failed"
                raise RuntimeFailure(reason, f"{image}: {text}") from exc
            pulled = time.monotonic() - started
        arch = found.attrs.get("Architecture")
        if arch and arch != architecture():
            raise RuntimeFailure(
                "image_invalid", f"{image} is built for {arch}, this node is {architecture()}"
            )
        return pulled

    def images(self) -> list[str]:
        """Manifest digests of the images in the local cache (`sha256:…`), at most 512."""
        digests: dict[str, None] = {}
        for image in self.client.images.list():
            for repo_digest in image.attrs.get("RepoDigests") or []:
                digests[repo_digest.partition("@")[2]] = None
        return [digest for digest in digests if digest][:IMAGES_MAX]

    # ------------------------------------------------------------------ containers
    def container_name(self, assignment: Assignment) -> str:
        return f"computepool-job{assignment.job}-l{assignment.lease}"

    def _network(self, assignment: Assignment) -> dict:
        if assignment.network_mode == "none":
            if assignment.ports:
                log.warning("job %s: ports are not published with network none", assignment.job)
            return {"network_mode": "none"}
        try:
            self.client.networks.get(POOL_NETWORK)
        except NotFound:
            self.client.networks.create(
                POOL_NETWORK,
                driver="bridge",
                options={"com.docker.network.bridge.enable_icc": "false"},
                labels={f"{LABEL}.network": "pool"},
            )
        if assignment.egress_allow:
            log.warning(
                "job %s: egress allow-list %s is NOT enforced by this agent",
                assignment.job,
                list(assignment.egress_allow),
            )
        return {
            "network": POOL_NETWORK,
            "ports": {f"{port}/tcp": None for port in assignment.ports},  # ephemeral host ports
        }

    def _scratch(self, assignment: Assignment) -> list[Mount]:
        size = assignment.limits.scratch_mib
        if size <= 0:
            return []
        volume = self.client.volumes.create(
            name=f"{self.container_name(assignment)}-scratch",
            driver="local",
            driver_opts={
                "type": "tmpfs",
                "device": "tmpfs",
                "o": f"size={size}m,uid=65534,gid=65534,mode=0700",
            },
            labels=assignment.labels(self.node_name),
        )
        return [Mount("/scratch", volume.name, type="volume")]

    def create(self, assignment: Assignment, workdir: Path):
        """The container of one attempt, created (not started) with the lease's limits."""
        check_digest(assignment.image)
        limits = assignment.limits
        name = self.container_name(assignment)
        self._remove_leftover(name)
        mounts = [
            Mount("/outputs", str(workdir / "outputs"), type="bind", read_only=False),
            Mount("/inputs", str(workdir / "inputs"), type="bind", read_only=True),
            *self._scratch(assignment),
        ]
        environment = assignment.environment() | {
            "OUTPUTS_DIR": "/outputs",
            "INPUTS_DIR": "/inputs",
            "SCRATCH_DIR": "/scratch",
            "CHECKPOINT_DIR": f"/outputs/{CHECKPOINT_SUBDIR}",
        }
        options = {
            "name": name,
            # how its GPUs are isolated, for whoever inspects the node's containers
            "labels": assignment.labels(self.node_name)
            | {f"{LABEL}.gpu_isolation": limits.gpu_isolation},
            "environment": environment,
            "user": NOBODY,
            "read_only": True,
            "tmpfs": {"/tmp": TMP_TMPFS},
            "mounts": mounts,
            "nano_cpus": limits.cpu_millicores * 1_000_000,
            "mem_limit": f"{limits.memory_mib}m",
            "memswap_limit": f"{limits.memory_mib}m",  # == memory: no extra swap
            "pids_limit": limits.pids,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "privileged": False,
            "ipc_mode": "private",
            "log_config": LogConfig(type="json-file", config={"max-size": "10m", "max-file": "3"}),
            **self._network(assignment),
        }
        if assignment.command:
            options["command"] = list(assignment.command)
        if limits.cpuset:
            options["cpuset_cpus"] = limits.cpuset
        if limits.gpus:
            options["device_requests"] = [
                DeviceRequest(driver="nvidia", device_ids=list(limits.gpus), capabilities=[["gpu"]])
            ]
        try:
            return self.client.containers.create(assignment.image, **options)
        except DockerException as exc:
            self._remove_volume(f"{name}-scratch")
            raise RuntimeFailure("runtime_error", f"create failed: {exc}") from exc

    def start(self, container) -> None:
        try:
            container.start()
        except DockerException as exc:
            raise RuntimeFailure("runtime_error", f"start failed: {exc}") from exc

    def _remove_leftover(self, name: str) -> None:
        """A container of the same attempt left by a crash between create and report."""
        try:
            self.client.containers.get(name).remove(force=True, v=True)
            log.info("removed leftover container %s", name)
        except NotFound:
            pass
        self._remove_volume(f"{name}-scratch")

    def _remove_volume(self, name: str) -> None:
        try:
            self.client.volumes.get(name).remove(force=True)
        except NotFound:
            pass
        except APIError as exc:
            log.warning("volume %s not removed: %s", name, exc)

    def poll(self, container) -> Ended | None:
        """None while the container runs (or is being created); how it ended otherwise."""
        try:
            container.reload()
        except NotFound:
            return Ended("failed", "runtime_error", None, "the container disappeared")
        state = container.attrs["State"]
        if state.get("Status") in ("exited", "dead"):
            return Ended.from_exit(int(state.get("ExitCode", -1)), oom=bool(state.get("OOMKilled")))
        return None

    def running(self, container) -> bool:
        return self.poll(container) is None and container.attrs["State"].get("Running", False)

    def elapsed(self, container) -> float:
        """Seconds since the container started (0 if unknown): max runtime survives restarts."""
        started = container.attrs["State"].get("StartedAt") or ""
        match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,6})?", started)
        if not match or started.startswith("0001-"):
            return 0.0
        moment = datetime.fromisoformat(match.group(1) + (match.group(2) or "")).replace(tzinfo=UTC)
        return max(0.0, (datetime.now(UTC) - moment).total_seconds())

    def route(self, container, host: str) -> dict | None:
        """{"host": node address, "ports": {"8080": 32768}} once ports are published."""
        ports = {}
        for key, bindings in (container.attrs["NetworkSettings"].get("Ports") or {}).items():
            if bindings:
                ports[key.partition("/")[0]] = int(bindings[0]["HostPort"])
        return {"host": host, "ports": ports} if ports else None

    def stop(self, container, grace: int) -> None:
        """SIGTERM, `grace` seconds, then SIGKILL."""
        with contextlib.suppress(NotFound):
            container.stop(timeout=max(0, int(grace)))

    def kill(self, container) -> None:
        with contextlib.suppress(NotFound, APIError):  # already gone or already stopped
            container.kill()

    def signal(self, container, name: str) -> None:
        """Send signal `name` ("SIGUSR1") to the container's main process."""
        with contextlib.suppress(NotFound, APIError):  # already gone or already stopped
            container.kill(signal=name)

    def remove(self, container) -> None:
        """The container and its scratch volume (scratch is deleted when a run ends)."""
        name = container.name
        with contextlib.suppress(NotFound):
            container.remove(force=True, v=True)
        self._remove_volume(f"{name}-scratch")

    def follow_logs(self, container, since: int | None = None) -> LogFollower:
        stream = container.logs(stream=True, follow=True, stdout=True, stderr=True, since=since)
        return LogFollower(stream)

    def usage(self, container) -> dict:
        """CPU (millicores over the last interval) and memory (MiB, without page cache)."""
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
        }

    def find(self) -> list[Found]:
        """This node's containers (by label), running or ended, for reconciliation."""
        found = []
        filters = {"label": [f"{LABEL}.job", f"{LABEL}.node={self.node_name}"]}
        for container in self.client.containers.list(all=True, filters=filters):
            labels = container.labels
            try:
                job, lease = int(labels[f"{LABEL}.job"]), int(labels[f"{LABEL}.lease"])
                attempt = int(labels.get(f"{LABEL}.attempt") or 1)
            except (KeyError, ValueError):
                continue
            ended = self.poll(container)
            found.append(Found(job, lease, attempt, container, ended is None, ended))
        return found
