"""The Docker runtime: every job in a container on the real Docker engine (Docker SDK).

Isolation, each limit taken from the lease (docs/data-plane.md, "Running a job"):
- the image only by digest (`…@sha256:<64 hex>`; anything else is refused as image_invalid);
- CPU quota (NanoCpus) and the lease's cpuset; memory with no extra swap (Memory ==
  MemorySwap); a pids limit; GPUs as the exact device UUIDs / MIG instances of the lease;
- a read-only root filesystem, /tmp a small tmpfs; /outputs an ext4 filesystem of the job's
  `output_limit_mib` and /scratch one of the lease's scratch (none when 0), each a sparse image
  loop-mounted below the attempt's directory (runtime/disks.py; ENOSPC past the limit, on disk,
  not in RAM), bind-mounted; /outputs is read back and restored only through the engine's
  archive API, never by host path; /inputs a read-only directory. A node that cannot make the
  filesystems (not root, no mkfs.ext4/mount/loop devices) fails the job `runtime_error`, and a
  job without an output limit is never run here;
- user nobody (65534:65534), every capability dropped, no-new-privileges, never privileged,
  no host namespaces (private IPC, no pid/net/uts/userns host mode), no Docker socket mounted;
- network `none`, or the pool network with egress limited to the allow-list: a small
  network-owner container (the pause image, `sleep`) joins the bridge network `computepool`
  (inter-container traffic off) and carries the published ports, bound to the pool's ingress
  address only; iptables rules are installed in its namespace (worker_agent/netpolicy.py:
  egress, and ingress from the job's `ingress_allow`) and only then is the job container
  started inside that namespace (`container:<owner>`, no NET_ADMIN: it cannot change them). A
  node that cannot enforce this (not root, no iptables/nsenter) fails such a job: runtime_error.
- inputs fetched in the job's namespace once its rules are installed, or for a job without a
  network in a throwaway owner's (`-inputs`) whose egress allows only the inputs' hosts
  (worker_agent/inputs.py), before the job container is created.
Secrets are files in /run/secrets, a read-only bind mount of a per-attempt ramfs the agent
unmounts on the host as soon as the container has started (runtime/secrets.py): never in the
container's environment or configuration, never on the node's disk.

Ownership: several agents may share the engine. Every container carries its owner's
labels (control-plane id and node id, base.Owner) and a name that starts with the
control-plane id; the agent finds, adopts and removes only what carries both labels of its own,
never a container by its name alone (a foreign one in the way fails the attempt).

`GVisorRuntime` is the same container, created on the same path with every limit above, under
gVisor's runsc instead of runc: the job talks to a kernel of gVisor's own (the sandbox's Sentry,
`uname -r` 4.4.0), not to the host's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, LogConfig, Mount

from worker_agent import netpolicy, tarstream
from worker_agent.host import architecture
from worker_agent.inventory import container_device_ids, load_nvml
from worker_agent.runtime import disks
from worker_agent.runtime import secrets as secret_files
from worker_agent.runtime.base import (
    CHECKPOINT_SUBDIR,
    JOB_USER_ID,
    LABEL,
    Assignment,
    Ended,
    Found,
    Owner,
    RuntimeFailure,
)

log = logging.getLogger(__name__)

DIGEST_RE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
NOBODY = "65534:65534"
JOB_USER = (65534, 65534)  # NOBODY as uid, gid: the owner of the job's secret files
SECRETS_DIR = secret_files.CONTAINER_DIR
POOL_NETWORK = "computepool"
# The network owner's image (needs `sleep`; the job's own image may not have it), pinned by
# digest when used; by default the busybox test image every node here has in its cache.
PAUSE_IMAGE_DEFAULT = "127.0.0.1:5000/computepool/busybox:test"
ROLE = f"{LABEL}.role"  # "network" on a network owner; job containers have no role label
OWNER_SUFFIX = "-net"
INPUTS_SUFFIX = "-inputs"  # the throwaway namespace a job without a network fetches inputs in
TMP_TMPFS = "rw,nosuid,nodev,size=64m"
IMAGES_MAX = 512
LOG_BUFFER_MAX = 8 * 1024 * 1024  # unsent log text kept per run; the oldest is dropped first
OOM_EVENT_GRACE_S = 2.0  # how long past an exit the engine's `oom` event may still arrive
TIMESTAMP_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,6})?")
# gVisor's two dockerd runtimes by network mode (.ci/ensure-services.sh registers them), since
# runsc's network flag is per runtime: `none` has no network stack at all; under `pool` runsc
# passes through the namespace Docker gives the container (its network owner's, with the egress
# rules), never the host's.
GVISOR_ENGINE_RUNTIMES = {"none": "runsc-none", "pool": "runsc-netns"}


def _moment(text: str | None) -> datetime | None:
    """An engine timestamp (nanoseconds, Z) as an aware datetime; None when unset (0001-…)."""
    match = TIMESTAMP_RE.match(text or "")
    if not match or text.startswith("0001-"):
        return None
    return datetime.fromisoformat(match.group(1) + (match.group(2) or "")).replace(tzinfo=UTC)


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

    def __init__(
        self,
        owner: Owner | None = None,
        client: docker.DockerClient | None = None,
        pause_image: str | None = None,
        nvml=None,
        secrets_root: Path | None = None,
    ):
        self.secrets_root = Path(secrets_root or secret_files.ROOT_DEFAULT)
        # None until the agent knows who it is (enrollment): nothing is created or found before
        self.owner = owner
        self.nvml = nvml  # None: the real NVML, loaded when a lease names MIG instances
        self.client = client or docker.from_env(timeout=120)
        self.pause_image = (
            pause_image or os.environ.get("WORKER_AGENT_PAUSE_IMAGE") or PAUSE_IMAGE_DEFAULT
        )

    def _device_ids(self, gpus) -> list[str]:
        """Whole GPUs by UUID; a MIG instance of the lease by the UUID of the MIG device at its
        slot (inventory.container_device_ids), read through NVML on this node."""
        if not any(str(g).startswith("MIG-") and "/" in str(g) for g in gpus):
            return [str(g) for g in gpus]
        try:
            nvml = self.nvml if self.nvml is not None else load_nvml()
        except Exception as exc:  # no driver: the instance cannot be named, never guessed
            raise RuntimeFailure("runtime_error", f"MIG devices need NVML: {exc}") from exc
        try:
            return container_device_ids(nvml, gpus)
        except LookupError as exc:
            raise RuntimeFailure("runtime_error", str(exc)) from exc

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

    def engine_runtime(self, assignment: Assignment) -> str | None:
        """The dockerd runtime the job's container is created with (None: the engine's default,
        runc)."""
        return None

    def runs(self, container) -> bool:
        """Whether a job container found on the engine is this runtime's (reconciliation)."""
        runtime = (container.attrs.get("HostConfig") or {}).get("Runtime")
        return runtime not in GVISOR_ENGINE_RUNTIMES.values()

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
    def _owned_by(self) -> Owner:
        if self.owner is None:
            raise RuntimeFailure("runtime_error", "the agent is not enrolled: no owner to run as")
        return self.owner

    def _labels(self, assignment: Assignment) -> dict[str, str]:
        return assignment.labels(self._owned_by())

    def _ours(self, thing) -> bool:
        """Whether a container (or volume) carries this agent's control-plane and node ids."""
        labels = getattr(thing, "labels", None)
        if labels is None:  # a volume: its labels are in its attributes
            labels = (getattr(thing, "attrs", None) or {}).get("Labels")
        return self.owner is not None and self.owner.owns(labels)

    def _secret_mounts(self) -> secret_files.HostMounts:
        """This node's own directory of secret mounts (no other agent sweeps it)."""
        owner = self._owned_by()
        return secret_files.HostMounts(self.secrets_root / owner.control_plane / str(owner.node_id))

    def container_name(self, assignment: Assignment) -> str:
        return f"{self._owned_by().prefix}-job{assignment.job}-l{assignment.lease}"

    def _network(self, assignment: Assignment, refused) -> tuple[dict, int | None]:
        """Mode none: no network. Otherwise the job joins its network owner's namespace, whose
        egress and ingress rules are installed before this returns (the job container is not
        created yet); with the owner's pid, where the inputs are fetched."""
        if assignment.network_mode == "none":
            if assignment.ports:
                log.warning("job %s: ports are not published with network none", assignment.job)
            return {"network_mode": "none"}, None
        problem = netpolicy.enforcement_problem()
        if problem:
            raise RuntimeFailure("runtime_error", str(netpolicy.unenforceable(problem)))
        pool = assignment.pool_network
        bounds = netpolicy.Bounds.of_pool(
            pool.egress_allowed, private_allowed=pool.private_ranges_allowed, refused=refused
        )
        name = self.container_name(assignment) + OWNER_SUFFIX
        owner = self._start_owner(assignment, name, assignment.ports)
        try:
            owner.reload()
            pid = int(owner.attrs["State"]["Pid"])
            allowed = netpolicy.enforce(
                pid,
                assignment.egress_allow,
                bounds,
                ports=assignment.ports,
                sources=assignment.ingress_allow,
            )
        except netpolicy.EgressError as exc:
            self._remove_owner_of(owner.name)
            raise RuntimeFailure("runtime_error", str(exc)) from exc
        except BaseException:
            self._remove_owner_of(owner.name)
            raise
        log.info("job %s: egress allowed to %s, all else dropped", assignment.job, allowed)
        return {"network_mode": f"container:{owner.id}"}, pid

    def _fetch_inputs(self, assignment: Assignment, pid: int | None, fetcher) -> None:
        """In the job's own namespace (`pid`, its owner's), or for a job without a network in a
        throwaway owner's on the pool network whose egress allows only the inputs' hosts (under
        the same address rules), removed once they are fetched."""
        if pid is not None:
            fetcher.run(f"/proc/{pid}/ns/net")
            return
        problem = netpolicy.enforcement_problem()
        if problem:
            raise RuntimeFailure(
                "runtime_error", f"inputs cannot be fetched in a namespace of their own ({problem})"
            )
        bounds = netpolicy.Bounds(fetcher.rules.private_allowed, fetcher.rules.refused)
        name = self.container_name(assignment) + INPUTS_SUFFIX
        owner = self._start_owner(assignment, name, ())
        try:
            owner.reload()
            pid = int(owner.attrs["State"]["Pid"])
            netpolicy.enforce(pid, fetcher.hosts, bounds)
            fetcher.run(f"/proc/{pid}/ns/net")
        except netpolicy.EgressError as exc:
            raise RuntimeFailure("runtime_error", str(exc)) from exc
        finally:
            with contextlib.suppress(NotFound, APIError):
                owner.remove(force=True, v=True)

    def _pool_network(self) -> None:
        try:
            self.client.networks.get(POOL_NETWORK)
        except NotFound:
            self.client.networks.create(
                POOL_NETWORK,
                driver="bridge",
                options={"com.docker.network.bridge.enable_icc": "false"},
                labels={f"{LABEL}.network": "pool"},
            )

    def _pinned_pause_image(self) -> str:
        """The pause image by digest (pulled when missing); a tag is pinned to its digest."""
        ref = self.pause_image
        try:
            image = self.client.images.get(ref)
        except ImageNotFound:
            try:
                image = self.client.images.pull(ref)
            except DockerException as exc:
                raise RuntimeFailure("runtime_error", f"pause image {ref}: {exc}") from exc
        if DIGEST_RE.match(ref):
            return ref
        repo = ref.rsplit(":", 1)[0] if ref.rfind(":") > ref.rfind("/") else ref
        for repo_digest in image.attrs.get("RepoDigests") or []:
            if repo_digest.partition("@")[0] == repo:
                return repo_digest
        raise RuntimeFailure("runtime_error", f"pause image {ref} has no registry digest")

    def _start_owner(self, assignment: Assignment, name: str, ports):
        """A network owner of the attempt: `sleep` on the pool network, hardened like a job,
        with tiny limits; the job's owner carries the published ports (the job shares its
        namespace), bound to the pool's ingress address only."""
        self._pool_network()
        image = self._pinned_pause_image()
        sysctls = {}
        if Path("/proc/sys/net/ipv6").exists():
            sysctls = {
                "net.ipv6.conf.all.disable_ipv6": "1",
                "net.ipv6.conf.default.disable_ipv6": "1",
            }
        bind = assignment.pool_network.ingress_address
        try:
            owner = self.client.containers.run(
                image,
                ["sleep", "2147483647"],
                name=name,
                detach=True,
                labels=self._labels(assignment) | {ROLE: "network"},
                user=NOBODY,
                read_only=True,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                privileged=False,
                ipc_mode="private",
                mem_limit="16m",
                memswap_limit="16m",
                pids_limit=8,
                nano_cpus=100_000_000,
                network=POOL_NETWORK,
                sysctls=sysctls,
                ports={f"{port}/tcp": (bind, None) for port in ports},  # ephemeral host ports
                log_config=LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            )
        except DockerException as exc:
            self._remove_ours(name)
            raise RuntimeFailure("runtime_error", f"network owner failed: {exc}") from exc
        return owner

    def _remove_ours(self, name: str) -> None:
        """The container of that name, when it is ours (never one by its name alone)."""
        try:
            container = self.client.containers.get(name)
        except NotFound:
            return
        if self._ours(container):
            with contextlib.suppress(NotFound, APIError):
                container.remove(force=True, v=True)

    def _remove_owner_of(self, name: str) -> None:
        """The network owner of job container `name` (or named so), if there is one of ours."""
        if not name.endswith(OWNER_SUFFIX):
            name += OWNER_SUFFIX
        try:
            owner = self.client.containers.get(name)
        except NotFound:
            return
        if owner.labels.get(ROLE) == "network" and self._ours(owner):
            with contextlib.suppress(NotFound, APIError):
                owner.remove(force=True, v=True)

    def _owner(self, container):
        """The network owner a job container shares (None: it has its own network)."""
        mode = (container.attrs.get("HostConfig") or {}).get("NetworkMode") or ""
        if not mode.startswith("container:"):
            return None
        try:
            owner = self.client.containers.get(mode.partition(":")[2])
        except NotFound:
            return None
        return owner if owner.labels.get(ROLE) == "network" and self._ours(owner) else None

    @staticmethod
    def _disks(assignment: Assignment, workdir: Path) -> list[Mount]:
        """/outputs (and /scratch when the lease has some) as filesystems of their limits
        (runtime/disks.py), made before anything of the job exists; never run unbounded."""
        limits = assignment.limits
        if limits.output_limit_mib <= 0:
            raise disks.unenforceable("the job has no output limit (output_limit_mib)")
        problem = disks.enforcement_problem()
        if problem:
            raise disks.unenforceable(problem)
        disks.release(workdir)  # what a crash left of this attempt (its container is gone)
        outputs = workdir / "outputs"
        disks.make(outputs, limits.output_limit_mib)
        checkpoint = outputs / CHECKPOINT_SUBDIR  # in the fresh filesystem: nothing of the job
        checkpoint.mkdir()
        os.chown(checkpoint, JOB_USER_ID, JOB_USER_ID)
        mounts = [Mount("/outputs", str(outputs), type="bind", read_only=False)]
        if limits.scratch_mib > 0 and not limits.scratch_in_memory:
            disks.make(workdir / "scratch", limits.scratch_mib)
            mounts.append(Mount("/scratch", str(workdir / "scratch"), type="bind"))
        return mounts

    @staticmethod
    def _memory_scratch(limits) -> dict:
        """A probe's /scratch: a tmpfs of its size, RAM counted against the memory limit."""
        if not (limits.scratch_in_memory and limits.scratch_mib > 0):
            return {}
        owner = f"uid={JOB_USER_ID},gid={JOB_USER_ID}"
        return {"/scratch": f"rw,nosuid,nodev,size={limits.scratch_mib}m,{owner},mode=0700"}

    def create(self, assignment: Assignment, workdir: Path, fetcher=None):
        """The container of one attempt, created (not started) with the lease's limits; its
        inputs fetched by `fetcher` (worker_agent/inputs.py) once its network exists."""
        check_digest(assignment.image)
        limits = assignment.limits
        device_ids = self._device_ids(limits.gpus) if limits.gpus else []  # before creating
        name = self.container_name(assignment)
        self._remove_leftover(name)
        if fetcher is not None:  # the addresses its inputs and its egress may not reach
            refused = fetcher.rules.refused
        else:
            refused = netpolicy.refused(assignment.pool_network)
        try:
            outputs, *scratch = self._disks(assignment, workdir)
            inputs = Mount("/inputs", str(workdir / "inputs"), type="bind", read_only=True)
            mounts = [outputs, inputs, *scratch]
            if assignment.secrets:  # a ramfs of this attempt, read-only in the container
                source = self._secret_mounts().prepare(name, assignment.secrets, *JOB_USER)
                mounts.append(Mount(SECRETS_DIR, str(source), type="bind", read_only=True))
            network, pid = self._network(assignment, refused)  # the owner and its rules, if any
            if assignment.inputs and fetcher is not None:
                self._fetch_inputs(assignment, pid, fetcher)
        except BaseException:
            disks.release(workdir)
            self._release_secrets(name)
            self._remove_owner_of(name)
            raise
        environment = assignment.environment(SECRETS_DIR) | {
            "OUTPUTS_DIR": "/outputs",
            "INPUTS_DIR": "/inputs",
            "SCRATCH_DIR": "/scratch",
            "CHECKPOINT_DIR": f"/outputs/{CHECKPOINT_SUBDIR}",
        }
        options = {
            "name": name,
            # how its GPUs are isolated, for whoever inspects the node's containers
            "labels": self._labels(assignment) | {f"{LABEL}.gpu_isolation": limits.gpu_isolation},
            "environment": environment,
            "user": NOBODY,
            "read_only": True,
            "tmpfs": {"/tmp": TMP_TMPFS} | self._memory_scratch(limits),
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
            **network,
        }
        if assignment.command:
            options["command"] = list(assignment.command)
        if limits.cpuset:
            options["cpuset_cpus"] = limits.cpuset
        if engine_runtime := self.engine_runtime(assignment):
            options["runtime"] = engine_runtime
        if limits.gpus:
            options["device_requests"] = [
                DeviceRequest(
                    driver="nvidia",
                    device_ids=device_ids,
                    capabilities=[["gpu"]],
                )
            ]
        try:
            return self.client.containers.create(assignment.image, **options)
        except DockerException as exc:
            self._remove_owner_of(name)
            self._release_secrets(name)
            disks.release(workdir)
            raise RuntimeFailure("runtime_error", f"create failed: {exc}") from exc

    def start(self, container) -> None:
        """Starts it, then unmounts its secrets on the host: the container's mount namespace
        holds the only reference left (they go with the container)."""
        try:
            container.start()
        except DockerException as exc:
            raise RuntimeFailure("runtime_error", f"start failed: {exc}") from exc
        finally:
            self._release_secrets(container.name)

    def _release_secrets(self, name: str) -> None:
        if self.owner is None:
            return
        try:
            self._secret_mounts().release(name)
        except OSError as exc:  # never keeps a run from ending; the next agent sweeps it
            log.warning("secrets of %s not unmounted: %s", name, exc)

    def _remove_leftover(self, name: str) -> None:
        """What a crash between create and report left of the same attempt, when it is ours;
        a container of that name that is not ours is left alone and fails the run."""
        for kind, getter, what in (
            ("container", self.client.containers.get, name),
            ("container", self.client.containers.get, name + OWNER_SUFFIX),
            ("container", self.client.containers.get, name + INPUTS_SUFFIX),
        ):
            try:
                found = getter(what)
            except NotFound:
                continue
            if not self._ours(found):
                raise RuntimeFailure(
                    "runtime_error", f"{kind} {what} exists and is not this node's: left alone"
                )
        for leftover in (name, name + OWNER_SUFFIX, name + INPUTS_SUFFIX):
            self._remove_ours(leftover)

    # ------------------------------------------------------------------ files, through the engine
    def get_archive(self, container, path: str):
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

    def put_archive(self, container, path: str, chunks) -> None:
        """Unpacks the tar stream `chunks` into `path` of the created (not started) container,
        through the engine (each member owned as its header says)."""
        try:
            if not container.put_archive(path, chunks):
                raise RuntimeFailure("runtime_error", f"the engine refused the files for {path}")
        except DockerException as exc:
            raise RuntimeFailure("runtime_error", f"writing {path}: {exc}") from exc

    def poll(self, container) -> Ended | None:
        """None while the container runs (or is being created); how it ended otherwise."""
        try:
            container.reload()
        except NotFound:
            return Ended("failed", "runtime_error", None, "the container disappeared")
        state = container.attrs["State"]
        if state.get("Status") not in ("exited", "dead"):
            return None
        code = int(state.get("ExitCode", -1))
        return Ended.from_exit(code, oom=bool(state.get("OOMKilled")) or self._oom_event(container))

    def _oom_event(self, container) -> bool:
        """Whether the engine logged an `oom` event for a container killed by SIGKILL. Docker's
        OOMKilled flag loses a race with the exit event on cgroup v2 (containerd #12714), so
        the engine's own event log, waited on a moment past the exit, settles it."""
        state = container.attrs["State"]
        if state.get("ExitCode") != 137 or not (started := _moment(state.get("StartedAt"))):
            return False
        finished = _moment(state.get("FinishedAt")) or datetime.now(UTC)
        until = max(datetime.now(UTC), finished + timedelta(seconds=OOM_EVENT_GRACE_S))
        filters = {"container": container.id, "event": "oom"}
        try:
            events = self.client.events(
                since=int(started.timestamp()) - 1,
                until=int(until.timestamp()) + 1,
                filters=filters,
                decode=True,
            )
            return any(True for _ in events)
        except (APIError, DockerException) as exc:
            log.warning("engine events for %s not read: %s", container.name, exc)
            return False

    def running(self, container) -> bool:
        return self.poll(container) is None and container.attrs["State"].get("Running", False)

    def elapsed(self, container) -> float:
        """Seconds since the container started (0 if unknown): max runtime survives restarts."""
        started = _moment(container.attrs["State"].get("StartedAt"))
        return max(0.0, (datetime.now(UTC) - started).total_seconds()) if started else 0.0

    def route(self, container, host: str) -> dict | None:
        """{"host": node address, "ports": {"8080": 32768}} once ports are published."""
        ports = {}
        holder = self._owner(container) or container  # ports are published on the owner
        for key, bindings in (holder.attrs["NetworkSettings"].get("Ports") or {}).items():
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
        """The container and its network owner (when a run ends); only ever ours. Its
        filesystems go with its attempt's directory (disks.release)."""
        if not self._ours(container):
            log.warning("container %s is not this node's: not removed", container.name)
            return
        name = container.name
        with contextlib.suppress(NotFound):
            container.remove(force=True, v=True)
        self._remove_owner_of(name)
        self._release_secrets(name)

    def follow_logs(self, container, since: int | None = None) -> LogFollower:
        stream = container.logs(stream=True, follow=True, stdout=True, stderr=True, since=since)
        return LogFollower(stream)

    def usage(self, container) -> dict:
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

    def find(self) -> list[Found]:
        """This node's job containers (by its owner labels), running or ended, for
        reconciliation; its network owners whose job container is gone are removed."""
        found = []
        if self.owner is None:
            return found
        # secret mounts a dead agent left (the containers that started hold their own)
        for name in self._secret_mounts().sweep():
            log.info("unmounted the secrets a previous agent left for %s", name)
        filters = {"label": [f"{LABEL}.job", *self.owner.label_filters()]}
        # listed sparse, then inspected one by one: one removed in between is skipped (a full
        # list inspects every container itself and fails on the first that is gone)
        containers = []
        for container in self.client.containers.list(all=True, sparse=True, filters=filters):
            with contextlib.suppress(NotFound):
                container.reload()
                if self._ours(container):  # the engine filtered; checked again here
                    containers.append(container)
        names = {container.name for container in containers}
        for container in containers:
            labels = container.labels
            if labels.get(ROLE) == "network":
                # a throwaway inputs namespace never outlives the create that made it
                job_name = container.name.removesuffix(OWNER_SUFFIX)
                if container.name.endswith(INPUTS_SUFFIX) or job_name not in names:
                    log.info("removing orphaned network owner %s", container.name)
                    with contextlib.suppress(NotFound, APIError):
                        container.remove(force=True, v=True)
                continue
            try:
                job, lease = int(labels[f"{LABEL}.job"]), int(labels[f"{LABEL}.lease"])
                attempt = int(labels.get(f"{LABEL}.attempt") or 1)
            except (KeyError, ValueError):
                continue
            if not self.runs(container):
                continue  # the other Docker-backed runtime's (gVisor's or runc's)
            ended = self.poll(container)
            found.append(Found(job, lease, attempt, container, ended is None, ended))
        return found


class GVisorRuntime(DockerRuntime):
    """The Docker runtime under gVisor: offered where dockerd has both runsc runtimes."""

    name = "gvisor"

    @staticmethod
    def available() -> bool:
        try:
            client = docker.from_env(timeout=5)
            try:
                loaded = client.info().get("Runtimes") or {}
            finally:
                client.close()
        except DockerException:
            return False
        return all(
            Path(str((loaded.get(name) or {}).get("path") or "")).name == "runsc"
            for name in GVISOR_ENGINE_RUNTIMES.values()
        )

    def engine_runtime(self, assignment: Assignment) -> str:
        return GVISOR_ENGINE_RUNTIMES["none" if assignment.network_mode == "none" else "pool"]

    def runs(self, container) -> bool:
        runtime = (container.attrs.get("HostConfig") or {}).get("Runtime")
        return runtime in GVISOR_ENGINE_RUNTIMES.values()

    def create(self, assignment: Assignment, workdir: Path, fetcher=None):
        if assignment.limits.gpus:  # refused before anything is created (runsc passes none)
            raise RuntimeFailure("runtime_unavailable", "gVisor runs no GPU work on this node")
        return super().create(assignment, workdir, fetcher)
