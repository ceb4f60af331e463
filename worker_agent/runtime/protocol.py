"""The agent's runtime contract: what the runner, the agent's loop, the outputs, checkpoints and
probes ask of a runtime, and all they ask (the Docker runtime and gVisor's variant of it,
worker_agent/runtime/docker.py; the process runtime, worker_agent/runtime/process.py).

Shaped after Nomad's DriverPlugin (`RecoverTask`, `StartTask`, `WaitTask`, `StopTask`,
`SignalTask`, `TaskStats`, `DestroyTask`), adapted to what one attempt here needs:

- `find` is RecoverTask for every run of this node at once: at start the agent reconciles what
  a previous agent left, so a found run carries how long it has run (`Found.elapsed_s`, for the
  maximum runtime) and how it ended, if it did; the agent's loop looks again every minute for
  runs no runner follows (a removal the engine refused).
- starting is three calls, not one: `pull` (its seconds are reported), `create` (limits,
  filesystems, the network and its rules, the inputs fetched in it; nothing runs yet: a
  checkpoint is unpacked into the created run with `unpack`) and `start`.
- `wait` never blocks past its `timeout` (0: a look): the runner's one loop watches the agent,
  cancellation and timers between two looks (worker_agent/runner.py).
- `stop` with a grace of 0 is the kill; `signal` sends any other signal (the checkpoint's).
- `archive`/`unpack` move files as tar streams through the runtime, never by a host path that a
  job's link could redirect (worker_agent/outputs.py, worker_agent/checkpoint.py).
- `ports` are the published ports only; the runner names the host in the route it reports.
- `logs` hands over output as it arrives (`LogStream.take`), `stats` a usage sample, `images`
  the digests cached for the heartbeat.
- `bounds_disks`: whether `create` makes /outputs and /scratch filesystems of their limits (a
  probe asks a runtime without them for none).
- `owner` is set by the agent once enrolled: a runtime creates, finds and removes only what
  carries its owner's ids (base.Owner); before that it creates and finds nothing.

A handle is whatever `create` returned (a Docker container, a process handle); only its runtime
reads it. Failures are `RuntimeFailure` with the reason the runner reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from worker_agent.runtime.base import Assignment, Ended, Found, Owner

Handle = object  # a runtime's own: what its `create` returned, read by it alone
START_TIMEOUT_S = 60.0  # `start` without a deadline of the caller's (tests, probes)


@runtime_checkable
class LogStream(Protocol):
    def take(self) -> str:
        """What the run printed since the last take (stdout and stderr)."""

    def join(self, timeout: float = 10) -> None:
        """Until everything printed before the run ended is taken in (at most `timeout`)."""


@runtime_checkable
class Runtime(Protocol):
    name: str  # the assignment's `runtime` it runs: docker, gvisor, process
    owner: Owner | None
    bounds_disks: bool

    def images(self) -> list[str]:
        """The image digests in the local cache (`sha256:…`), for the heartbeat."""

    def find(self, *, tidy: bool = True) -> list[Found]:
        """This node's runs on this host, running or ended (reconciliation at agent start).
        `tidy`: also remove what a dead agent left beside them (at start only: while runners
        run, their half-made parts would look the same)."""

    def pull(self, assignment: Assignment) -> float:
        """The image made present locally; the seconds the pull took (0: cached)."""

    def create(self, assignment: Assignment, workdir: Path, fetcher=None) -> Handle:
        """The attempt made ready to start, with every limit of its lease, its inputs fetched
        by `fetcher` (worker_agent/inputs.py) where the runtime says."""

    def start(self, handle: Handle, timeout: float = START_TIMEOUT_S) -> None:
        """Started; returns once it runs (or already ended). RuntimeFailure startup_timed_out
        (and killed) when it does not within `timeout` seconds."""

    def wait(self, handle: Handle, timeout: float = 0.0) -> Ended | None:
        """How it ended; None while it still runs after `timeout` seconds."""

    def stop(self, handle: Handle, grace: float) -> None:
        """SIGTERM, `grace` seconds, then SIGKILL; a grace of 0: SIGKILL at once."""

    def signal(self, handle: Handle, name: str) -> None:
        """Signal `name` ("SIGUSR1") to the job's process (a run that ended: nothing)."""

    def remove(self, handle: Handle) -> None:
        """Everything of the run on this host, when it is this node's (after it ended)."""

    def ports(self, handle: Handle) -> dict[str, int]:
        """The published ports: the job's port ("8080") → the port on the node."""

    def logs(self, handle: Handle, since: int | None = None) -> LogStream:
        """Its output from the start, or from `since` (a Unix time) for an adopted run."""

    def stats(self, handle: Handle) -> dict:
        """A usage sample: cpu_millicores, memory_mib (and net_tx_bytes where known); {}
        when none can be read."""

    def archive(self, handle: Handle, path: str) -> BinaryIO | None:
        """`path` of the stopped run ("/outputs", "/outputs/name") as a readable tar stream;
        None when it does not exist there."""

    def unpack(self, handle: Handle, path: str, chunks) -> None:
        """The tar stream `chunks` unpacked into `path` of the created, not started run."""
