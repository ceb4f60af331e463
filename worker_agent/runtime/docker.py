"""The Docker runtime: every job in a container on the real Docker engine (Docker SDK), one
implementation of the runtime contract (runtime/protocol.py).

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
  no host namespaces (private IPC, no pid/net/uts/userns host mode), no Docker socket mounted
  (runtime/container_spec.py);
- network `none`, or the pool network with egress limited to the allow-list, in the namespace
  of the attempt's network owner, whose rules are installed before the job container exists;
  inputs fetched in that namespace, or for a job without a network in a throwaway one
  (runtime/network_owner.py).
Secrets are files in /run/secrets, a read-only bind mount of a per-attempt ramfs the agent
unmounts on the host as soon as the container has started (runtime/secrets.py): never in the
container's environment or configuration, never on the node's disk.

Ownership: several agents may share the engine; the agent finds, adopts and removes only what
carries both labels of its own (runtime/engine.py), never a container by its name alone (a
foreign one in the way fails the attempt). Logs, files, usage and OOM kills are read through
the engine (runtime/engine_io.py).

The pause image (the network owners' `sleep`) has no default: without `--pause-image` or
WORKER_AGENT_PAUSE_IMAGE the runtime is not made and the agent does not start
(`make run` and the tests give the busybox test image of the loopback registry).

`GVisorRuntime` is the same container, created on the same path with every limit above, under
gVisor's runsc instead of runc: the job talks to a kernel of gVisor's own (the sandbox's Sentry,
`uname -r` 4.4.0), not to the host's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from worker_agent import mps as mps_daemons
from worker_agent import netpolicy
from worker_agent.host import architecture
from worker_agent.inventory import load_nvml
from worker_agent.mig import MigRefused, checked_device_ids
from worker_agent.runtime import disks, engine_io
from worker_agent.runtime import secrets as secret_files
from worker_agent.runtime.base import (
    JOB_USER_ID,
    LABEL,
    Assignment,
    Ended,
    Found,
    Owner,
    RuntimeFailure,
    RuntimeUnconfigured,
    wait_for_end,
)
from worker_agent.runtime.container_spec import (
    check_digest,
    disk_mounts,
    inputs_mount,
    job_options,
    mps_options,
    secrets_mount,
    volume_mounts,
)
from worker_agent.runtime.engine import (
    Engine,
    never_started,
    remove_container,
    seconds_since_start,
)
from worker_agent.runtime.network_owner import (
    INPUTS_SUFFIX,
    OWNER_SUFFIX,
    POOL_NETWORK,
    NetworkOwners,
    is_network_owner,
)
from worker_agent.runtime.protocol import START_TIMEOUT_S

__all__ = ["INPUTS_SUFFIX", "OWNER_SUFFIX", "POOL_NETWORK", "DockerRuntime", "GVisorRuntime"]

log = logging.getLogger(__name__)

PAUSE_IMAGE_ENV = "WORKER_AGENT_PAUSE_IMAGE"
IMAGES_MAX = 512
START_STEP_S = 0.1
# gVisor's two dockerd runtimes by network mode (.ci/ensure-services.sh registers them), since
# runsc's network flag is per runtime: `none` has no network stack at all; under `pool` runsc
# passes through the namespace Docker gives the container (its network owner's, with the egress
# rules), never the host's.
GVISOR_ENGINE_RUNTIMES = {"none": "runsc-none", "pool": "runsc-netns"}
# What a CUDA allocation past an MPS share's memory cap prints (the runtime API's error
# string, its enum name, the driver API's): read from the end of an MPS job's output only.
CUDA_OOM_MARKERS = ("out of memory", "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")
OOM_TAIL_LINES = 50


class DockerRuntime:
    name = "docker"
    bounds_disks = True

    def __init__(
        self,
        owner: Owner | None = None,
        client: docker.DockerClient | None = None,
        pause_image: str | None = None,
        nvml=None,
        secrets_root: Path | None = None,
        mps: mps_daemons.MpsDaemons | None = None,
    ):
        pause_image = pause_image or os.environ.get(PAUSE_IMAGE_ENV, "")
        if not pause_image:
            raise RuntimeUnconfigured(
                "the Docker runtime needs a pause image, the `sleep` of its jobs' network owners "
                f"(a tag or digest this node has or can pull): give --pause-image or set "
                f"{PAUSE_IMAGE_ENV}"
            )
        self.secrets_root = Path(secrets_root or secret_files.ROOT_DEFAULT)
        self.nvml = nvml  # None: the real NVML, loaded when a lease names MIG instances
        self.mps = mps  # the node's MPS daemons (worker_agent/mps.py); None: no MPS shares
        self.client = client or docker.from_env(timeout=120)
        self.engine = Engine(self.client, owner)
        self.networks = NetworkOwners(self.engine, pause_image)

    @property
    def owner(self) -> Owner | None:
        return self.engine.owner

    @owner.setter
    def owner(self, owner: Owner | None) -> None:
        self.engine.owner = owner

    def container_name(self, assignment: Assignment) -> str:
        return self.engine.container_name(assignment)

    def helper_image(self) -> str:
        """The pause image pinned by its digest: the one image of this runtime's own (the
        network owners', and the recovery probes' where a probe names none)."""
        return self.networks.pinned_image()

    def _device_ids(self, gpus, mig_profiles=None) -> list[str]:
        """Whole GPUs by UUID; a MIG instance of the lease by the UUID of the MIG device at its
        slot, read through NVML on this node after checking that its profile is the leased one
        (worker_agent.mig.checked_device_ids: `mig_profile_mismatch` otherwise)."""
        if not any(str(g).startswith("MIG-") and "/" in str(g) for g in gpus):
            return [str(g) for g in gpus]
        try:
            nvml = self.nvml if self.nvml is not None else load_nvml()
        except Exception as exc:  # no driver: the instance cannot be named, never guessed
            raise RuntimeFailure("runtime_error", f"MIG devices need NVML: {exc}") from exc
        try:
            return checked_device_ids(nvml, gpus, dict(mig_profiles or ()))
        except MigRefused as exc:
            raise RuntimeFailure(exc.reason, exc.message) from exc

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

    def _mps_for(self, assignment: Assignment) -> dict | None:
        """An MPS share's daemon (started if need be) and what its container adds; None for
        every other lease. `mps_unavailable` when the daemon cannot run: never without caps."""
        limits = assignment.limits
        if not limits.mps:
            return None
        try:
            share = mps_daemons.the_share(limits.mps, limits.gpus)
            if self.mps is None:
                raise mps_daemons.MpsUnavailable("this agent runs no MPS daemons")
            endpoint = self.mps.ensure(share.gpu)
        except mps_daemons.MpsUnavailable as exc:
            raise RuntimeFailure(exc.reason, exc.message) from exc
        return mps_options(endpoint, share)

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
        return list(self.image_sizes())

    def image_sizes(self) -> dict[str, int]:
        """{manifest digest: bytes on this node} of the local cache, at most 512 (the engine's
        image list: its repo digests and sizes), for the heartbeat's cache report."""
        sizes: dict[str, int] = {}
        for image in self.client.images.list():
            size = int(image.attrs.get("Size") or 0)
            for repo_digest in image.attrs.get("RepoDigests") or []:
                digest = repo_digest.partition("@")[2]
                if digest:
                    sizes.setdefault(digest, size)
        return dict(list(sizes.items())[:IMAGES_MAX])

    # ------------------------------------------------------------------ create and start
    def _secret_mounts(self) -> secret_files.HostMounts:
        """This node's own directory of secret mounts (no other agent sweeps it)."""
        owner = self.engine.owned_by()
        return secret_files.HostMounts(self.secrets_root / owner.control_plane / str(owner.node_id))

    def create(self, assignment: Assignment, workdir: Path, fetcher=None):
        """The container of one attempt, created (not started) with the lease's limits; its
        inputs fetched by `fetcher` (worker_agent/inputs.py) once its network exists."""
        check_digest(assignment.image)
        limits = assignment.limits
        # before creating anything: a MIG slot whose instance is not the leased one refuses
        device_ids = self._device_ids(limits.gpus, limits.mig_profiles) if limits.gpus else []
        mps = self._mps_for(assignment)  # its daemon, before anything of the job exists
        name = self.container_name(assignment)
        self._remove_leftover(name)
        if fetcher is not None:  # the addresses its inputs and its egress may not reach
            refused = fetcher.rules.refused
        else:
            refused = netpolicy.refused(assignment.pool_network)
        try:
            outputs, *scratch = disk_mounts(assignment, workdir)
            mounts = [outputs, inputs_mount(workdir), *scratch, *volume_mounts(assignment)]
            if assignment.secrets:  # a ramfs of this attempt, read-only in the container
                secrets = assignment.secrets
                source = self._secret_mounts().prepare(name, secrets, JOB_USER_ID, JOB_USER_ID)
                mounts.append(secrets_mount(source))
            network, pid = self.networks.network_for(assignment, refused)  # owner and rules
            if assignment.inputs and fetcher is not None:
                self.networks.fetch_inputs(assignment, pid, fetcher)
            options = job_options(
                assignment,
                name=name,
                labels=self.engine.labels(assignment),
                mounts=mounts,
                network=network,
                device_ids=device_ids,
                engine_runtime=self.engine_runtime(assignment),
                mps=mps,
            )
            try:
                return self.client.containers.create(assignment.image, **options)
            except DockerException as exc:
                raise RuntimeFailure("runtime_error", f"create failed: {exc}") from exc
        except BaseException:
            disks.release(workdir)
            self._release_secrets(name)
            self.networks.remove_of(name)
            raise

    def start(self, container, timeout: float = START_TIMEOUT_S) -> None:
        """Starts it, then unmounts its secrets on the host: the container's mount namespace
        holds the only reference left (they go with the container). Returns once it runs or
        has ended."""
        try:
            container.start()
        except DockerException as exc:
            raise RuntimeFailure("runtime_error", f"start failed: {exc}") from exc
        finally:
            self._release_secrets(container.name)
        deadline = time.monotonic() + timeout
        while self._look(container) is None and not container.attrs["State"].get("Running"):
            if time.monotonic() > deadline:
                self.stop(container, 0)
                raise RuntimeFailure("startup_timed_out", "the container did not start")
            time.sleep(START_STEP_S)

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
        names = (name, name + OWNER_SUFFIX, name + INPUTS_SUFFIX)
        for what in names:
            found = self.engine.get(what)
            if found is not None and not self.engine.ours(found):
                raise RuntimeFailure(
                    "runtime_error", f"container {what} exists and is not this node's: left alone"
                )
        for leftover in names:
            self.engine.remove_ours(leftover)

    # ------------------------------------------------------------------ the run
    def wait(self, container, timeout: float = 0.0) -> Ended | None:
        return wait_for_end(lambda: self._look(container), timeout)

    def _look(self, container) -> Ended | None:
        """None while the container runs (or is being created); how it ended otherwise."""
        try:
            container.reload()
        except NotFound:
            return Ended.failed("runtime_error", "the container disappeared")
        state = container.attrs["State"]
        if state.get("Status") not in ("exited", "dead"):
            return None
        code = int(state.get("ExitCode", -1))
        oom = bool(state.get("OOMKilled")) or engine_io.oom_event(self.client, container)
        if code != 0 and not oom and self._past_mps_memory(container):
            return Ended.failed(
                "gpu_memory_share_exceeded",
                f"exit code {code}; its output ends with a CUDA out-of-memory error: it most "
                "likely allocated past its MPS share's GPU memory",
                code,
            )
        return Ended.from_exit(code, oom=oom)

    def _past_mps_memory(self, container) -> bool:
        """Whether an MPS share's container ended with a CUDA out-of-memory error in the last
        lines of its output (the agent cannot see inside the job: its words are all it has)."""
        if (container.labels or {}).get(f"{LABEL}.mps") != "1":
            return False
        try:
            tail = container.logs(stdout=True, stderr=True, tail=OOM_TAIL_LINES)
        except (NotFound, APIError):
            return False
        text = tail.decode(errors="replace") if isinstance(tail, bytes) else str(tail)
        return any(marker in text for marker in CUDA_OOM_MARKERS)

    def stop(self, container, grace: float) -> None:
        if grace <= 0:
            with contextlib.suppress(NotFound, APIError):  # already gone or already stopped
                container.kill()
            return
        with contextlib.suppress(NotFound):
            container.stop(timeout=int(grace))

    def signal(self, container, name: str) -> None:
        with contextlib.suppress(NotFound, APIError):  # already gone or already stopped
            container.kill(signal=name)

    def remove(self, container) -> None:
        """The container and its network owner (when a run ends); only ever ours. Its
        filesystems go with its attempt's directory (disks.release)."""
        if not self.engine.ours(container):
            log.warning("container %s is not this node's: not removed", container.name)
            return
        name = container.name
        with contextlib.suppress(NotFound):
            container.remove(force=True, v=True)
        self.networks.remove_of(name)
        self._release_secrets(name)

    def ports(self, container) -> dict[str, int]:
        """{"8080": 32768} once ports are published (on the network owner)."""
        ports = {}
        holder = self.networks.of(container) or container
        for key, bindings in (holder.attrs["NetworkSettings"].get("Ports") or {}).items():
            if bindings:
                ports[key.partition("/")[0]] = int(bindings[0]["HostPort"])
        return ports

    def logs(self, container, since: int | None = None) -> engine_io.LogFollower:
        stream = container.logs(stream=True, follow=True, stdout=True, stderr=True, since=since)
        return engine_io.LogFollower(stream)

    def stats(self, container) -> dict:
        return engine_io.usage(container)

    def archive(self, container, path: str):
        return engine_io.read_archive(container, path)

    def unpack(self, container, path: str, chunks) -> None:
        engine_io.write_archive(container, path, chunks)

    # ------------------------------------------------------------------ reconciliation
    def find(self, *, tidy: bool = True) -> list[Found]:
        """This node's job containers (by its owner labels), running or ended, for
        reconciliation; with `tidy`, its network owners whose job container is gone are
        removed, and secret mounts a dead agent left. One created and never started (the agent
        died in between) is found neither running nor ended (`running` False, `ended` None):
        the runner starts its attempt afresh."""
        found = []
        if self.owner is None:
            return found
        # secret mounts a dead agent left (the containers that started hold their own)
        for name in self._secret_mounts().sweep() if tidy else ():
            log.info("unmounted the secrets a previous agent left for %s", name)
        filters = {"label": [f"{LABEL}.job", *self.owner.label_filters()]}
        # listed sparse, then inspected one by one: one removed in between is skipped (a full
        # list inspects every container itself and fails on the first that is gone)
        containers = []
        for container in self.client.containers.list(all=True, sparse=True, filters=filters):
            with contextlib.suppress(NotFound):
                container.reload()
                if self.engine.ours(container):  # the engine filtered; checked again here
                    containers.append(container)
        names = {container.name for container in containers}
        for container in containers:
            labels = container.labels
            if is_network_owner(container):
                if tidy and self.networks.is_orphan(container, names):
                    log.info("removing orphaned network owner %s", container.name)
                    remove_container(container)
                continue
            try:
                job, lease = int(labels[f"{LABEL}.job"]), int(labels[f"{LABEL}.lease"])
                attempt = int(labels.get(f"{LABEL}.attempt") or 1)
            except (KeyError, ValueError):
                continue
            if not self.runs(container):
                continue  # the other Docker-backed runtime's (gVisor's or runc's)
            ended = self._look(container)  # None for a created one too: it has not ended
            running = ended is None and not never_started(container)
            elapsed = seconds_since_start(container)
            found.append(Found(job, lease, attempt, container, running, ended, elapsed))
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
        if assignment.limits.mps:  # its client could not reach the host's daemon from runsc
            raise RuntimeFailure(
                mps_daemons.UNAVAILABLE, "gVisor runs no MPS share: it needs the Docker runtime"
            )
        if assignment.limits.gpus:  # refused before anything is created (runsc passes none)
            raise RuntimeFailure("runtime_unavailable", "gVisor runs no GPU work on this node")
        return super().create(assignment, workdir, fetcher)
