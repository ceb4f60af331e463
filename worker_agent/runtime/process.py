"""The local process runtime: for trusted development pools ONLY (pool policy
`allow_process_runtime`; the control plane sends `runtime: "process"` nowhere else).

It does NOT isolate: the job runs as the agent's own user, sees the host's filesystem and
network, and can signal the agent's other processes. What it does:
- the command runs as given (`sh -c` only when the job's command says so), in its own session,
  in a per-attempt directory holding inputs/, outputs/ and scratch/, with OUTPUTS_DIR,
  INPUTS_DIR, SCRATCH_DIR (and TMPDIR) set. There is no `/outputs`: a job written for the
  container (`echo hello > /outputs/greeting.txt`) needs the Docker runtime; under this one it
  writes to "$OUTPUTS_DIR/greeting.txt" (or the relative `outputs/greeting.txt`).
- secrets as files in the attempt's `secrets/` (mode 0400, the agent's own user), NAME_FILE
  naming each, removed when the run is: on the node's disk, readable by every process of that
  user (nothing here isolates).
- rlimits as possible: RLIMIT_AS = the leased memory (virtual, not resident memory: a program
  may fail earlier than in a container), RLIMIT_CPU = max runtime × leased CPUs (seconds of CPU),
  RLIMIT_NPROC = pids (counted per user, not per job). No CPU quota, no cpuset, no GPU
  restriction, no scratch size cap, no network policy: a job with mode `pool` and an egress
  allow-list fails with runtime_error rather than run with the host's whole network.
- the exit status is known only to the agent that started it: after an agent restart a process
  still running is followed by its pid, and its end is reported as runtime_error.
- the pid file is the launch's record, and it is durable before the job's command runs: the
  process starts as a small `sh` that waits on a pipe from the agent, which writes the pid
  file (fsync'd, renamed into place) and only then lets it go. It `exec`s the command (same
  pid, same session) only if the pid file is there once the pipe gives it the word or closes;
  an agent killed before the record was written closes the pipe by dying, and the process
  exits without running anything. So a process running the command always has its pid file,
  and the next agent, finding none, may launch the attempt again without a second copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from worker_agent import tarstream
from worker_agent.runtime import secrets as secret_files
from worker_agent.runtime.base import (
    CHECKPOINT_SUBDIR,
    Assignment,
    Ended,
    Found,
    Owner,
    RuntimeFailure,
    wait_for_end,
)
from worker_agent.runtime.protocol import START_TIMEOUT_S

log = logging.getLogger(__name__)

PID_FILE = "process.json"
LAUNCH_EXIT = 111  # the launch's own `sh` exits with this when the agent never recorded it
# The launch: wait for the agent's word on stdin (or its end: the agent died), then run the
# command only where the agent recorded its pid. `$1` is the pid file, the rest the command.
LAUNCH_SCRIPT = (
    f'IFS= read -r go || :; [ -f "$1" ] || exit {LAUNCH_EXIT}; shift; exec "$@" </dev/null'
)
SECRETS_SUBDIR = "secrets"  # NAME_FILE → <attempt>/secrets/NAME (mode 0400, the agent's user)
LOG_FILE = "output.log"


@dataclass
class ProcessHandle:
    workdir: Path
    assignment: Assignment | None = None
    popen: subprocess.Popen | None = None
    pid: int | None = None


class FileFollower:
    """Reads what a log file gained since the last `take()`."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset, self._lock = path, offset, threading.Lock()

    def take(self) -> str:
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                return ""
            self.offset += len(data)
        return data.decode(errors="replace")

    def join(self, timeout: float = 0) -> None:
        pass


def _limits(assignment: Assignment):
    limits = assignment.limits
    cpu_seconds = None
    if assignment.max_runtime_s:
        cpus = max(1, -(-limits.cpu_millicores // 1000))
        cpu_seconds = assignment.max_runtime_s * cpus + 5

    def apply():  # runs in the child between fork and exec
        os.setsid()
        memory = limits.memory_mib * 1024 * 1024
        for kind, value in (
            (resource.RLIMIT_AS, memory),
            (resource.RLIMIT_NPROC, limits.pids),
            (resource.RLIMIT_CPU, cpu_seconds),
        ):
            if value is None:
                continue
            # above the hard limit: keep what the agent has
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(kind, (value, value))

    return apply


class ProcessRuntime:
    """The runtime contract (runtime/protocol.py) over local processes."""

    name = "process"
    bounds_disks = False  # the job writes where it likes: a probe asks it for no disk

    def __init__(self, owner: Owner | None = None, work_dir: str | os.PathLike = "."):
        self.owner = owner  # set by the agent once enrolled; pid files name it
        self.work_dir = Path(work_dir)  # the work root: attempts/<job>-a<n>/
        # offered beside Docker for the pools that allow it; each job it runs warns on its own
        log.info("process runtime offered: its jobs run as local processes, NOT isolated")

    def pull(self, assignment: Assignment) -> float:
        return 0.0  # no image: the command runs on the host as it is

    def images(self) -> list[str]:
        return []

    def create(self, assignment: Assignment, workdir: Path, fetcher=None) -> ProcessHandle:
        """The job's directory; its inputs fetched by `fetcher` in the node's namespace (the
        address rules apply: this runtime has no namespace of the job's own to fetch in)."""
        if not assignment.command:
            raise RuntimeFailure("runtime_error", "the process runtime needs a command")
        limits = assignment.limits
        if limits.mps:
            # Its client would use the host's /dev/shm, not its daemon's (worker_agent/mps.py),
            # and CUDA runs a client that does not reach its daemon with no caps at all.
            raise RuntimeFailure(
                "mps_unavailable",
                "the process runtime runs no MPS share: it needs the Docker runtime",
            )
        if limits.output_limit_mib or limits.scratch_mib:
            # The job writes where it likes as the agent's user: a size would be a false promise.
            raise RuntimeFailure(
                "runtime_error",
                "disk limits cannot be enforced on this node: the process runtime has none "
                f"(output_limit_mib {limits.output_limit_mib}, scratch_mib {limits.scratch_mib}; "
                "its pools set the knob output_limit_mib to 0 and ask for no scratch)",
            )
        if assignment.volumes:  # a volume is a filesystem of its size: the agent mounts none here
            raise RuntimeFailure(
                "runtime_error",
                "persistent volumes need the Docker (or gVisor) runtime: the process runtime "
                "mounts nothing",
            )
        for folder in ("scratch", "tmp", "outputs", f"outputs/{CHECKPOINT_SUBDIR}"):
            (workdir / folder).mkdir(exist_ok=True)
        if assignment.network_mode == "pool" and assignment.egress_allow:
            # It runs on the host's network: an allow-list would be a promise it cannot keep.
            raise RuntimeFailure(
                "runtime_error",
                "egress cannot be enforced on this node: the process runtime has no network "
                "policy (an egress allow-list needs the Docker runtime)",
            )
        secrets = workdir / SECRETS_SUBDIR
        shutil.rmtree(secrets, ignore_errors=True)  # a leftover of a crashed agent
        if assignment.secrets:
            secrets.mkdir(mode=0o700)
            secret_files.write_files(secrets, assignment.secrets, os.geteuid(), os.getegid())
        if assignment.inputs and fetcher is not None:
            fetcher.run(None)
        return ProcessHandle(workdir=workdir, assignment=assignment)

    def start(self, handle: ProcessHandle, timeout: float = START_TIMEOUT_S) -> None:
        """Its pid recorded (the pid file), then it runs: nothing more to wait for. Until the
        record is written the process only waits (the module's docstring: the launch)."""
        assignment, workdir = handle.assignment, handle.workdir
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(workdir),
            "OUTPUTS_DIR": str(workdir / "outputs"),
            "INPUTS_DIR": str(workdir / "inputs"),
            "SCRATCH_DIR": str(workdir / "scratch"),
            "CHECKPOINT_DIR": str(workdir / "outputs" / CHECKPOINT_SUBDIR),
            "TMPDIR": str(workdir / "tmp"),
        } | assignment.environment(str(workdir / SECRETS_SUBDIR))
        log.warning("job %s runs as a local process: NOT isolated", assignment.job)
        command = list(assignment.command)
        _check_executable(command[0], env["PATH"], workdir)
        pid_file = workdir / PID_FILE
        pid_file.unlink(missing_ok=True)  # only this launch's record lets it run
        read, write = os.pipe()
        try:
            with open(workdir / LOG_FILE, "ab") as out:
                handle.popen = subprocess.Popen(
                    ["/bin/sh", "-c", LAUNCH_SCRIPT, "computepool-launch", str(pid_file), *command],
                    cwd=workdir,
                    env=env,
                    stdin=read,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_limits(assignment),
                )
        except OSError as exc:
            os.close(write)
            raise RuntimeFailure("runtime_error", f"start failed: {exc}") from exc
        finally:
            os.close(read)
        handle.pid = handle.popen.pid
        try:
            self._record(handle)
        except OSError as exc:
            os.close(write)  # no record: it exits without running the command
            handle.popen.wait()
            raise RuntimeFailure("runtime_error", f"start failed: pid file: {exc}") from exc
        self._release(write)

    def _record(self, handle: ProcessHandle) -> None:
        """The launch's record, the pid file, durable before the command may run."""
        assignment = handle.assignment
        record = {"pid": handle.pid, "job": assignment.job, "lease": assignment.lease}
        record |= {"attempt": assignment.attempt} | (self.owner.labels() if self.owner else {})
        pid_file = handle.workdir / PID_FILE
        partial = pid_file.with_name(PID_FILE + ".partial")
        with open(partial, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, pid_file)
        folder = os.open(handle.workdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    @staticmethod
    def _release(write: int) -> None:
        """The word to the waiting launch: the command runs (its record is written)."""
        try:
            os.write(write, b"go\n")
        except OSError:  # it died meanwhile: `wait` says how
            pass
        finally:
            os.close(write)

    # the files of an attempt, as the Docker runtime hands them out: tar streams
    def archive(self, handle: ProcessHandle, path: str):
        """`path` ("/outputs/…", below the attempt's directory) as a tar stream written by a
        thread into a pipe: links as links (never followed), FIFOs and devices as such (never
        opened). The job ran as the agent's own user, so this reads nothing it could not."""
        local = handle.workdir / path.strip("/")
        if not os.path.lexists(local):
            return None
        read, write = os.pipe()

        def pack():
            with (
                contextlib.suppress(OSError, tarfile.TarError),
                open(write, "wb") as out,
                tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
                tar.add(local, arcname=local.name)  # stops at a reader that went away

        threading.Thread(target=pack, daemon=True, name=f"archive-{local.name}").start()
        return open(read, "rb")

    def unpack(self, handle: ProcessHandle, path: str, chunks) -> None:
        root = handle.workdir / path.strip("/")
        try:
            tarstream.extract_plain(tarstream.reader(chunks), root)
        except (OSError, tarfile.TarError) as exc:
            raise RuntimeFailure("runtime_error", f"writing {path}: {exc}") from exc

    def wait(self, handle: ProcessHandle, timeout: float = 0.0) -> Ended | None:
        return wait_for_end(lambda: self._look(handle), timeout)

    def _look(self, handle: ProcessHandle) -> Ended | None:
        if handle.popen is not None:
            code = handle.popen.poll()
            if code is None:
                return None
            if code < 0:  # killed by a signal
                return Ended.failed("exited_nonzero", f"killed by signal {-code}", 128 - code)
            return Ended.from_exit(code)
        if handle.pid and _alive(handle.pid):
            return None
        return Ended.failed("runtime_error", "exit status lost across an agent restart")

    def ports(self, handle: ProcessHandle) -> dict[str, int]:
        """The job's own ports, on the host's network as they are."""
        ports = handle.assignment.ports if handle.assignment else ()
        return {str(port): port for port in ports}

    def _signal(self, handle: ProcessHandle, sig) -> None:
        if handle.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.pid, sig)

    def signal(self, handle: ProcessHandle, name: str) -> None:
        """Send signal `name` ("SIGUSR1") to the job's process group."""
        self._signal(handle, getattr(signal, name))

    def stop(self, handle: ProcessHandle, grace: float) -> None:
        if grace > 0:
            self._signal(handle, signal.SIGTERM)
            self.wait(handle, grace)
        self._signal(handle, signal.SIGKILL)
        if handle.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.popen.wait(timeout=10)

    def remove(self, handle: ProcessHandle) -> None:
        (handle.workdir / PID_FILE).unlink(missing_ok=True)
        shutil.rmtree(handle.workdir / SECRETS_SUBDIR, ignore_errors=True)

    def logs(self, handle: ProcessHandle, since=None) -> FileFollower:
        path = handle.workdir / LOG_FILE
        offset = path.stat().st_size if since is not None and path.exists() else 0
        return FileFollower(path, offset)

    def stats(self, handle: ProcessHandle) -> dict:
        try:
            root = psutil.Process(handle.pid)
            procs = [root, *root.children(recursive=True)]
            cpu = sum(p.cpu_percent(interval=0.2) for p in procs)
            rss = sum(p.memory_info().rss for p in procs)
        except (psutil.Error, TypeError):
            return {}
        return {"cpu_millicores": int(cpu * 10), "memory_mib": rss // (1024 * 1024)}

    def find(self, *, tidy: bool = True) -> list[Found]:
        """The processes this node started (their pid files name its owner labels); nothing
        to tidy beside them."""
        found = []
        if self.owner is None:
            return found
        for pid_file in (self.work_dir / "attempts").glob(f"*/{PID_FILE}"):
            try:
                record = json.loads(pid_file.read_text())
                if not self.owner.owns(record):
                    continue
                handle = ProcessHandle(workdir=pid_file.parent, pid=int(record["pid"]))
                job, lease = int(record["job"]), int(record["lease"])
            except (OSError, ValueError, KeyError):
                continue
            ended, attempt = self._look(handle), int(record.get("attempt", 1))
            elapsed = _seconds_since_start(handle.pid)
            found.append(Found(job, lease, attempt, handle, not ended, ended, elapsed))
        return found


def _check_executable(program: str, path: str, cwd: Path) -> None:
    """The command's program found as exec would find it (a name on PATH, a path from the job's
    directory): the launch's `sh` would only exit 127, so a missing one is a failed start."""
    if "/" in program:
        found = (cwd / program) if not os.path.isabs(program) else Path(program)
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return
    elif shutil.which(program, path=path):
        return
    raise RuntimeFailure(
        "runtime_error", f"start failed: {program!r}: no such executable (PATH {path})"
    )


def _seconds_since_start(pid: int) -> float:
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
