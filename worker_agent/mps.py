"""CUDA MPS on the node: one control daemon per GPU that MPS leases use, and the settings a
job's client needs to reach it with its lease's caps (docs/scheduler.md "What each sharing
class isolates"; docs/data-plane.md "Running a job").

A lease of an MPS share carries `limits.mps`: per device its UUID, `thread_percentage` (its
compute, gpu_milli / 10) and `memory_mib` (its memory, the same fraction of the device's; one
rule with placement, `placement.devices.mps_memory_mib`). Shares are of exactly one GPU (a
shape's rule), since a CUDA client talks to one control daemon and each GPU has its own here.

Per GPU the agent runs `nvidia-cuda-mps-control -f` (in the foreground, its child, so it is
supervised: restarted when it died, stopped when no MPS lease of the GPU remains), with:
- `CUDA_VISIBLE_DEVICES` = the GPU's UUID (the daemon and its server see that device alone);
- `CUDA_MPS_PIPE_DIRECTORY` = `<run root>/<GPU>/pipe` (run root `/run/computepool-mps`, or
  WORKER_AGENT_MPS_RUN_DIR; not below the work root, which is 0700: the MPS server runs as the
  jobs' uid and reaches the pipes by path): the only folder of the daemon's a job gets,
  bind-mounted at /run/nvidia-mps (clients reach the daemon through its pipes and sockets);
- `CUDA_MPS_LOG_DIRECTORY` = `<state dir>/mps/<GPU>`: never mounted into a job;
- its own /dev/shm: the daemon runs in a mount namespace of its own (`unshare --mount`) where
  `<run root>/<GPU>/shm` is bound over /dev/shm, and the job's container gets the same folder
  as its /dev/shm. MPS clients share POSIX shared memory with their server, which NVIDIA's
  containers get with `--ipc=host`; this shares the one folder instead, so the job keeps a
  private IPC namespace and never sees the host's /dev/shm (the way NVIDIA's Kubernetes device
  plugin mounts its MPS shm folder into client containers);
- the GPU's compute mode set to EXCLUSIVE_PROCESS (`nvidia-smi -c`), so the MPS server holds
  the device's one context: a client that does not reach the daemon cannot open a context of
  its own beside it (a CUDA program that finds no daemon otherwise runs without MPS, with no
  caps at all). Set back to DEFAULT when the daemon is stopped.

Whatever of that cannot be done — the binary missing, the agent not root, no `unshare`, the
compute mode not settable, the daemon not answering — fails the attempt `mps_unavailable`
before any container exists: an MPS share never runs without its caps.

What the caps are, and are not: the CUDA driver applies `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in the client from its environment, which the job owns;
a job that changes them before CUDA starts gets the daemon's defaults (the whole device). All
jobs run as uid 65534, so the jobs on one GPU share one MPS server, and a fatal GPU fault of
one client ends the others' work. Hence MPS is `shared-not-isolated` and tenant mixing on MPS
devices stays off unless a pool allows it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
CONTROL_ENV = "WORKER_AGENT_MPS_CONTROL"  # another path of the control binary
RUN_DIR_ENV = "WORKER_AGENT_MPS_RUN_DIR"
RUN_DIR = "/run/computepool-mps"  # per GPU: pipe/ and shm/ (a tmpfs on most hosts)
SMI_BINARY = "nvidia-smi"
CONTAINER_PIPE_DIR = "/run/nvidia-mps"  # where a job's client finds its daemon's pipes
UNAVAILABLE = "mps_unavailable"
PID_FILE = "daemon.pid"  # in the GPU's log folder: a daemon a previous agent left
OUTPUT_FILE = "daemon.out"
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
# The daemon's one mount of its own: the GPU's shm folder over /dev/shm, then the binary.
SHM_WRAPPER = 'mount --bind "$0" /dev/shm && exec "$1" -f'
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class MpsUnavailable(Exception):
    """An MPS share cannot run here with its caps: the attempt fails `mps_unavailable` (the
    runtimes raise it as their RuntimeFailure), before anything of the job exists."""

    reason = UNAVAILABLE

    def __init__(self, message: str):
        self.message = message
        super().__init__(f"{UNAVAILABLE}: {message}")


@dataclass(frozen=True)
class MpsShare:
    """One device of an MPS lease, as the assignment's `limits.mps` carries it."""

    gpu: str  # the device's UUID (GPU-…)
    milli: int
    thread_percentage: int  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    memory_mib: int  # CUDA_MPS_PINNED_DEVICE_MEM_LIMIT

    @classmethod
    def parse_all(cls, items) -> tuple[MpsShare, ...]:
        shares = []
        for item in items or ():
            if not isinstance(item, dict) or not item.get("gpu"):
                continue
            shares.append(
                cls(
                    gpu=str(item["gpu"])[:80],
                    milli=int(item.get("milli") or 0),
                    thread_percentage=max(1, min(100, int(item.get("thread_percentage") or 1))),
                    memory_mib=max(0, int(item.get("memory_mib") or 0)),
                )
            )
        return tuple(shares)


@dataclass(frozen=True)
class Endpoint:
    """Where a GPU's daemon is reached from the host: its pipe and shm folders."""

    gpu: str
    pipe_dir: Path
    shm_dir: Path


def the_share(shares: tuple[MpsShare, ...], gpus: tuple[str, ...]) -> MpsShare:
    """The one device of an MPS lease, or `mps_unavailable`: a client reaches one daemon."""
    if len(shares) != 1:
        raise MpsUnavailable(f"an MPS share is of exactly one GPU; this lease names {len(shares)}")
    share = shares[0]
    if share.gpu not in gpus:
        raise MpsUnavailable(f"the MPS share's {share.gpu} is not the lease's GPU")
    if share.memory_mib <= 0:
        raise MpsUnavailable("the MPS share names no GPU memory: nothing to cap")
    return share


def client_environment(share: MpsShare, pipe_dir: str) -> dict[str, str]:
    """The environment of the share's client: its daemon's pipes, its compute and memory caps.
    The client sees its one GPU as device 0 (the container is given that device alone; the
    process runtime's CUDA_VISIBLE_DEVICES names it)."""
    return {
        "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share.thread_percentage),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share.memory_mib}M",
    }


class _Daemon:
    """One GPU's control daemon: its process (ours, or adopted by pid from a previous agent)."""

    def __init__(self, endpoint: Endpoint, log_dir: Path, popen=None, pid: int | None = None):
        self.endpoint, self.log_dir, self.popen, self.pid = endpoint, log_dir, popen, pid

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return bool(self.pid) and _pid_alive(self.pid)


class MpsDaemons:
    """The node's MPS control daemons, one per GPU with an MPS lease (see the module)."""

    def __init__(
        self,
        run_root: str | os.PathLike | None,
        log_root: str | os.PathLike,
        *,
        control: str | None = None,
        smi: str | None = SMI_BINARY,
        private_shm: bool = True,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ):
        run_root = run_root or os.environ.get(RUN_DIR_ENV) or RUN_DIR
        self.run_root, self.log_root = Path(run_root), Path(log_root)
        self.control = control or os.environ.get(CONTROL_ENV) or CONTROL_BINARY
        self.smi = smi  # "" or None: the compute mode is left as it is (tests)
        self.private_shm = private_shm
        self.ready_timeout_s = ready_timeout_s
        self._daemons: dict[str, _Daemon] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ what jobs ask
    def problem(self) -> str | None:
        """Why this node cannot run MPS daemons, or None."""
        if os.geteuid() != 0:
            return "the MPS control daemon needs root (the agent runs as another user)"
        if not _resolve(self.control):
            return f"{self.control} is not installed on this node (the NVIDIA driver's utils)"
        if self.private_shm and not shutil.which("unshare"):
            return "unshare (util-linux) is missing: the daemon's /dev/shm cannot be its own"
        if self.smi and not _resolve(self.smi):
            return f"{self.smi} is missing: the GPU's compute mode cannot be set"
        return None

    def ensure(self, gpu: str) -> Endpoint:
        """The GPU's daemon, started (or found running) and answering; `mps_unavailable`
        when it cannot be."""
        with self._lock:
            daemon = self._daemons.get(gpu)
            if daemon is not None and daemon.alive():
                return daemon.endpoint
            problem = self.problem()
            if problem:
                raise MpsUnavailable(problem)
            daemon = self._adopt(gpu) or self._start(gpu)
            self._daemons[gpu] = daemon
            return daemon.endpoint

    def running(self) -> dict[str, int | None]:
        """{GPU UUID: daemon pid} of the daemons held, alive or not (for tests and logs)."""
        with self._lock:
            return {
                gpu: (d.popen.pid if d.popen is not None else d.pid)
                for gpu, d in self._daemons.items()
            }

    # ------------------------------------------------------------------ the agent's loop
    def retain(self, gpus) -> None:
        """Stops the daemons of GPUs no MPS lease of this node uses any more."""
        keep = set(gpus)
        with self._lock:
            for gpu in [gpu for gpu in self._daemons if gpu not in keep]:
                self._stop(gpu)

    def supervise(self) -> None:
        """Starts again a daemon that died while its GPU still has MPS leases."""
        with self._lock:
            for gpu, daemon in list(self._daemons.items()):
                if daemon.alive():
                    continue
                log.warning("MPS daemon of %s is gone: starting it again", gpu)
                del self._daemons[gpu]
                try:
                    self._daemons[gpu] = self._start(gpu)
                except MpsUnavailable as exc:
                    log.error("MPS daemon of %s not restarted: %s", gpu, exc.message)

    def stop_all(self) -> None:
        with self._lock:
            for gpu in list(self._daemons):
                self._stop(gpu)

    # ------------------------------------------------------------------ one daemon
    def _dirs(self, gpu: str) -> tuple[Endpoint, Path]:
        name = _SAFE.sub("_", gpu)[:100]
        base = self.run_root / name
        endpoint = Endpoint(gpu, base / "pipe", base / "shm")
        return endpoint, self.log_root / name

    def _environment(self, endpoint: Endpoint, log_dir: Path) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CUDA_VISIBLE_DEVICES": endpoint.gpu,
            "CUDA_MPS_PIPE_DIRECTORY": str(endpoint.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
        }

    def _adopt(self, gpu: str) -> _Daemon | None:
        """A daemon of this GPU a previous agent left running (its jobs may still run)."""
        endpoint, log_dir = self._dirs(gpu)
        try:
            pid = int((log_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        if not _pid_alive(pid):
            return None
        log.info("MPS daemon of %s (pid %s) adopted", gpu, pid)
        return _Daemon(endpoint, log_dir, pid=pid)

    def _start(self, gpu: str) -> _Daemon:
        endpoint, log_dir = self._dirs(gpu)
        for folder in (self.run_root, endpoint.pipe_dir.parent, endpoint.pipe_dir, log_dir):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)  # the server (uid 65534) reaches its pipes by path
        for leftover in endpoint.pipe_dir.iterdir():  # a dead daemon's pipes
            with contextlib.suppress(OSError):
                leftover.unlink()
        endpoint.shm_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(endpoint.shm_dir, 0o1777)  # the server and its clients run as uid 65534
        self._compute_mode(gpu, "EXCLUSIVE_PROCESS")
        env = self._environment(endpoint, log_dir)
        control = _resolve(self.control) or self.control
        if self.private_shm:
            command = ["unshare", "--mount", "--propagation", "private", "--"]
            command += ["sh", "-c", SHM_WRAPPER, str(endpoint.shm_dir), control]
        else:
            command = [control, "-f"]
        try:
            with open(log_dir / OUTPUT_FILE, "ab") as out:
                popen = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the agent's signals are not the daemon's
                )
        except OSError as exc:
            raise MpsUnavailable(f"{self.control} did not start: {exc}") from exc
        daemon = _Daemon(endpoint, log_dir, popen=popen)
        self._wait_ready(daemon)
        (log_dir / PID_FILE).write_text(str(popen.pid))
        log.info("MPS daemon of %s started (pid %s)", gpu, popen.pid)
        return daemon

    def _wait_ready(self, daemon: _Daemon) -> None:
        """Until the daemon made its control pipe, or `mps_unavailable` (and it is stopped)."""
        deadline = time.monotonic() + self.ready_timeout_s
        control_pipe = daemon.endpoint.pipe_dir / "control"
        while not os.path.lexists(control_pipe):
            if not daemon.alive() or time.monotonic() > deadline:
                self._end(daemon)
                why = "exited" if daemon.popen.poll() is not None else "did not answer"
                tail = _tail(daemon.log_dir / OUTPUT_FILE)
                raise MpsUnavailable(
                    f"the MPS daemon of {daemon.endpoint.gpu} {why}"
                    + (f": {tail}" if tail else ""),
                )
            time.sleep(0.05)

    def _stop(self, gpu: str) -> None:
        daemon = self._daemons.pop(gpu, None)
        if daemon is None:
            return
        env = self._environment(daemon.endpoint, daemon.log_dir)
        control = _resolve(self.control)
        if control and daemon.alive():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [control],
                    input=b"quit\n",
                    env=env,
                    timeout=STOP_TIMEOUT_S,
                    check=False,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        self._end(daemon)
        (daemon.log_dir / PID_FILE).unlink(missing_ok=True)
        with contextlib.suppress(MpsUnavailable):
            self._compute_mode(gpu, "DEFAULT")
        log.info("MPS daemon of %s stopped", gpu)

    def _end(self, daemon: _Daemon) -> None:
        """Its process group terminated (then killed), whatever `quit` did."""
        pid = daemon.popen.pid if daemon.popen is not None else daemon.pid
        if not pid:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            while daemon.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not daemon.alive():
                break
            deadline = time.monotonic() + 2
        if daemon.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.popen.wait(timeout=2)

    def _compute_mode(self, gpu: str, mode: str) -> None:
        if not self.smi:
            return
        smi = _resolve(self.smi) or self.smi
        try:
            done = subprocess.run(
                [smi, "-i", gpu, "-c", mode], capture_output=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise MpsUnavailable(f"compute mode of {gpu}: {exc}") from exc
        if done.returncode != 0:
            text = (done.stderr or done.stdout or b"").decode(errors="replace").strip()[:300]
            raise MpsUnavailable(f"compute mode {mode} of {gpu} not set: {text}")


def _resolve(binary: str) -> str | None:
    if os.sep in binary:
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _tail(path: Path, size: int = 400) -> str:
    try:
        data = path.read_bytes()[-size:]
    except OSError:
        return ""
    return data.decode(errors="replace").strip()


__all__ = [
    "CONTAINER_PIPE_DIR",
    "UNAVAILABLE",
    "Endpoint",
    "MpsDaemons",
    "MpsShare",
    "MpsUnavailable",
    "client_environment",
    "the_share",
]
