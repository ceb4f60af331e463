"""One assignment, one thread: pulling → starting → running (+route) → ended, every step
reported with the lease's fencing token (docs/data-plane.md).

`starting` is reported BEFORE the container starts: it commits the lease, and a refusal (409:
the job was cancelled or moved meanwhile) means nothing is started at all. Inputs are fetched
into the attempt's inputs/ before start, in the job's own network namespace (worker_agent/
inputs.py, called by the runtime's create); logs are posted in chunks while the job runs; whatever
the job wrote to /outputs is read through the runtime's archive of the stopped container and
uploaded when it ends, before the final report (which releases the lease; worker_agent/
outputs.py). An attempt after a checkpoint first restores it into the created container's
/outputs/checkpoint, through the same archive API (worker_agent/checkpoint.py). A job that
leaves the assignments, or whose lease is `stopping` (it was cancelled), is stopped with its
grace period and removed; then `stopped` is reported (the control plane holds a stopping lease's
capacity until it). When the agent itself stops, runners leave their containers running for
the next agent to reconcile (`found`), and a report the control plane has not taken by then is
left to that agent too. An end the runner reports of its own (a failure it met, a refusal)
comes only once the attempt's container is stopped and removed: the job never outlives its
reported end (the control plane may run it again elsewhere from then on).

The runner talks to its runtime through the contract of worker_agent/runtime/protocol.py alone.
Where it is is a `Phase`; while the job runs, `_monitor` only dispatches, every poll, to small
handlers that each look at one thing (exit, halt, cancel, maximum runtime, logs, checkpoint,
usage).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tarfile
import threading
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from worker_agent import addresses, inputs
from worker_agent import checkpoint as checkpoints
from worker_agent.client import RETRY_STATUSES, ApiClient, ApiError, ApiUnreachable
from worker_agent.metrics import AgentMetrics
from worker_agent.outputs import Outputs, read_budget
from worker_agent.runtime import disks
from worker_agent.runtime.base import (
    CHECKPOINT_SIGNAL,
    END_STEPS,
    Assignment,
    Ended,
    Found,
    RuntimeFailure,
    Step,
)
from worker_agent.runtime.protocol import Runtime
from worker_agent.volumes import Volumes

log = logging.getLogger(__name__)

LOG_CHUNK = 48 * 1024  # characters per POST to /logs (the API takes 256 KiB of UTF-8)
LOG_FLUSH_S = 2.0
USAGE_EVERY_S = 10.0
REPORT_RETRY_S = 5.0  # a report the control plane could not take is sent again after this
AGAIN_LOG_S = 60.0  # a report sent again and again: its warning once, then once per this
STOPPING = "stopping"  # an assignment's state once its job was cancelled


class Phase(StrEnum):
    """Where a runner is with its run."""

    PULLING = "pulling"
    STARTING = "starting"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    LEFT_RUNNING = "left running"  # the agent stops: its container runs on for the next agent
    ENDED = "ended"


# The run's state in the heartbeat's workloads (nodes/api/serializers.py WorkloadSerializer),
# by phase; a phase not here is not listed.
WORKLOAD_STATE = {
    Phase.PULLING: "leased",
    Phase.STARTING: "starting",
    Phase.RUNNING: "running",
    Phase.CHECKPOINTING: "checkpointing",
}


@dataclass
class Every:
    """A duty of the watch, due every `period` seconds (at once the first time)."""

    period: float
    last: float = float("-inf")

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.period:
            return False
        self.last = now
        return True


class Fenced(Exception):
    """The control plane refused a report (409): this attempt is no longer the job's."""


class Deadline:
    """The startup deadline: `seconds` of the runner's own work (pull, create, inputs, restore,
    start). The time spent waiting for the control plane to take a report is not counted
    (`extend`): a control plane away for longer than the startup timeout delays the run, it
    does not fail it `startup_timed_out`."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def extend(self, seconds: float) -> None:
        self.end += seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()


class Runner(threading.Thread):
    def __init__(
        self,
        assignment: Assignment,
        *,
        client: ApiClient,
        runtime: Runtime | None,
        workdir: Path,
        address: str = "127.0.0.1",
        found: Found | None = None,
        poll_s: float = 1.0,
        gpu_usage=None,
        metrics: AgentMetrics | None = None,
        volumes: Volumes | None = None,
    ):
        super().__init__(daemon=True, name=f"job-{assignment.job}")
        self.volumes = volumes  # the node's persistent volumes (worker_agent/volumes.py)
        self.assignment, self.client, self.runtime = assignment, client, runtime
        if client is not None:
            client.trace_job(assignment.job, assignment.traceparent)
        self.workdir, self.address, self.found, self.poll_s = workdir, address, found, poll_s
        self.metrics = metrics
        # the job left the assignments, or its lease is stopping (it was cancelled): stop and
        # remove, then confirm with `stopped` (the control plane holds the capacity until then)
        self.cancelled = threading.Event()
        if assignment.state == STOPPING:
            self.cancelled.set()
        self.end_reported = False  # the run's last report (END_STEPS) was taken
        self.halted = threading.Event()  # the agent stops: leave the container running
        # how long a report the control plane could not take waits before it is sent again
        self.report_retry_s = REPORT_RETRY_S
        self.checkpoint = threading.Event()  # the control plane asks for a checkpoint
        if assignment.checkpoint_requested:
            self.checkpoint.set()
        self.gpu_usage = gpu_usage  # uuids → {"gpu_utilization_percent", "gpu_memory_mib"}
        self.phase = Phase.PULLING
        self.usage: dict = {}
        self.outcome: Ended | None = None
        self._follower = None
        self.started_at = 0.0  # time.monotonic() when the run started (the maximum runtime's)
        self._logs_due, self._usage_due = Every(LOG_FLUSH_S), Every(USAGE_EVERY_S)
        # the attempt's container (the runtime's handle) while one is on the host: stopped and
        # removed before the runner reports an end of its own, left when the agent stops
        self._handle = None
        self._deadline: Deadline | None = None  # while starting: reports' waits extend it
        self._resent, self._resent_logged = 0, float("-inf")  # a report sent again: how often

    # ------------------------------------------------------------------ for the agent
    def cancel(self) -> None:
        self.cancelled.set()

    def halt(self) -> None:
        self.halted.set()

    def request_checkpoint(self) -> None:
        self.checkpoint.set()

    def workload(self) -> dict | None:
        state = WORKLOAD_STATE.get(self.phase)
        if state is None:
            return None
        entry = {"lease": self.assignment.lease, "job": self.assignment.job, "state": state}
        if self.usage:
            entry["usage"] = dict(self.usage)
        return entry

    # ------------------------------------------------------------------ the thread
    def run(self) -> None:
        a = self.assignment
        try:
            if self.runtime is None:  # refused before anything is pulled or created
                message = f"runtime {a.runtime} is not offered by this node's agent"
                self._end_quietly(Ended.failed("runtime_unavailable", message))
            elif a.state == STOPPING:  # cancelled: stop what of it runs here (then confirmed)
                if self.found is not None:
                    self._stop_container(self.found.handle)
            elif self.found is not None:
                self._adopt(self.found)
            elif a.state == "starting":
                # reported starting by an earlier agent that died before it made the container:
                # nothing of the attempt ran, so it is launched again under the same lease
                log.info("job %s: starting, and no container was made: launching afresh", a.job)
                self._launch()
            elif a.state != "leased":
                # Reported starting/running by an earlier agent, and no container is left.
                self._report(
                    Step.FAILED, "runtime_error", message="the container is gone (agent restart)"
                )
            else:
                self._launch()
        except Fenced as exc:
            # no longer this node's attempt (or stopped while starting): nothing of it runs on
            log.warning("job %s: report refused (%s); abandoning this attempt", a.job, exc)
            if self._discard():
                self._clean_workdir()
        except ApiUnreachable as exc:
            # A report not taken when the agent stopped: what ran is still on the host, with
            # its directory, and the next agent's reconciliation reports it.
            log.error("job %s: report not taken (%s); left for reconciliation", a.job, exc)
            if self._handle is not None:
                self.phase = Phase.LEFT_RUNNING
        except RuntimeFailure as exc:
            log.warning("job %s failed: %s", a.job, exc)
            self._end_quietly(Ended.failed(exc.reason, exc.message))
        except Exception as exc:  # never let a runner die silently
            log.exception("job %s: runner error", a.job)
            self._end_quietly(Ended.failed("runtime_error", f"agent error: {exc}"))
        finally:
            if self.cancelled.is_set() and not self.halted.is_set() and not self.end_reported:
                self._confirm_stopped()
            if self.phase != Phase.LEFT_RUNNING:
                self.phase = Phase.ENDED

    def _confirm_stopped(self) -> None:
        """A cancelled run's last report, once nothing of it runs here any more: `stopped`. A
        refusal (the lease had already ended) or an unreachable control plane changes nothing
        here; the control plane then ends the lease when a heartbeat no longer lists it."""
        try:
            self._report(Step.STOPPED, message="stopped: its job was cancelled")
        except (Fenced, ApiError, ApiUnreachable) as exc:
            log.info("job %s: stop not confirmed: %s", self.job, exc)

    def _stop_container(self, handle) -> None:
        """SIGTERM, the stop grace, SIGKILL; the last log lines sent; the container removed."""
        a = self.assignment
        log.info("job %s: stopping (grace %ss)", a.job, a.stop_grace_s)
        self.runtime.stop(handle, a.stop_grace_s)
        self._flush_logs(quiet=True)
        self._remove(handle)
        self._clean_workdir()

    def _remove(self, handle) -> None:
        """The container removed with its network owner (and secrets' mounts)."""
        self.runtime.remove(handle)
        if handle is self._handle:
            self._handle = None

    def _discard(self) -> bool:
        """The attempt's container, if one is here, stopped (its grace) and removed: before the
        runner reports an end of its own, or abandons an attempt no longer this node's, nothing
        of it may run on. False when the runtime could not (the run is then left as it is, for
        the next reconciliation, rather than reported ended while it may still run)."""
        handle = self._handle
        if handle is None:
            return True
        log.warning("job %s: stopping its container: the run ends here", self.job)
        try:
            self._stop_container(handle)
        except Exception:
            log.exception("job %s: its container could not be stopped and removed", self.job)
            with contextlib.suppress(Exception):  # a kill and a forced removal, at least
                self.runtime.stop(handle, 0)
                self._remove(handle)
        return self._handle is None

    def _launch(self) -> None:
        a = self.assignment = self._bound(self.assignment)
        deadline = self._deadline = Deadline(a.startup_timeout_s)
        self._report(Step.PULLING, "image_pulling")
        pull_seconds = self._before(deadline, "image pull", lambda: self.runtime.pull(a))
        if self.metrics is not None:
            self.metrics.image_pull.observe(pull_seconds)
        self._report(Step.PULLING, "image_pulled", pull_seconds=round(pull_seconds, 3))
        if self.cancelled.is_set():
            return
        self.phase = Phase.STARTING
        self._report(Step.STARTING)
        self._prepare_dirs()
        a = self.assignment = self._with_volumes(a)
        starting = time.monotonic()
        handle = self._handle = self.runtime.create(a, self.workdir, self._fetcher(deadline))
        try:
            if a.restore:  # an earlier attempt's checkpoint, in $CHECKPOINT_DIR before start
                restored = self._before(
                    deadline,
                    "restoring the checkpoint",
                    lambda: checkpoints.restore(self.client, a, self.runtime, handle),
                )
                log.info("job %s: %d checkpoint files restored", a.job, restored)
            self.runtime.start(handle, timeout=max(0.0, deadline.remaining()))
            if self.metrics is not None:  # create and start, the inputs' fetch and restore in
                self.metrics.container_start.observe(time.monotonic() - starting)
            self._follower = self.runtime.logs(handle)
        except BaseException:
            with contextlib.suppress(Exception):  # whatever of it started (a process: not
                self.runtime.stop(handle, 0)  # removed by `remove`)
            self._remove(handle)
            raise
        finally:
            self._deadline = None
        self._running(handle)  # refused (Fenced): stopped and removed by run()
        self.started_at = time.monotonic()
        self._monitor(handle)

    def _adopt(self, found: Found) -> None:
        """A container a previous agent started: report where it is, then follow it. One it
        created and never started (neither running nor ended) is started afresh."""
        a = self.assignment
        if not found.running and found.ended is None:
            self._start_afresh(found)
            return
        self._handle = found.handle  # a refused `running` (Fenced): stopped and removed
        log.info("job %s: reconciling its container (running=%s)", a.job, found.running)
        if a.state in ("leased", "starting"):
            self._running(found.handle)
        self.phase = Phase.RUNNING
        self._follower = self.runtime.logs(found.handle, since=int(time.time()))
        self.started_at = time.monotonic() - found.elapsed_s
        self._monitor(found.handle)

    def _start_afresh(self, found: Found) -> None:
        """The previous agent died between the container's create and its start: nothing of
        the attempt ever ran, so there is no run to follow (one followed as running would only
        end at its maximum runtime) and none to double. The container is removed with what was
        made for it (its network owner, its secrets' and disks' mounts, inputs: the directory),
        then the attempt is launched again under the same lease and token (the control plane
        takes the pull's notes and a repeated `starting` of a starting job)."""
        a = self.assignment
        log.info("job %s: its container was created but never started: starting afresh", a.job)
        self._remove(found.handle)
        self._clean_workdir()
        if a.state not in ("leased", "starting"):  # reported running, yet it never started
            message = "the container never started (agent restart)"
            self._report(Step.FAILED, "runtime_error", message=message)
            return
        self._launch()

    def _bound(self, a: Assignment) -> Assignment:
        """The assignment with its ports' bind address settled: the pool's `ingress_address`,
        or this agent's own route address where the pool says "node" (an address, or a name
        resolved here)."""
        wanted = a.pool_network.ingress_address
        host = self.address if wanted == "node" else wanted
        address = addresses.ip_literal(host)
        if address is None and a.ports and a.network_mode == "pool":
            try:
                address = addresses.ip_literal(socket.getaddrinfo(host, None)[0][4][0])
            except (OSError, UnicodeError) as exc:
                raise RuntimeFailure("runtime_error", f"ingress address {host!r}: {exc}") from exc
        bind = str(address) if address is not None else "127.0.0.1"
        return replace(a, pool_network=replace(a.pool_network, ingress_address=bind))

    def _with_volumes(self, a: Assignment) -> Assignment:
        """The assignment with each persistent volume made (or mounted again) on the node, and
        the host folder its container gets."""
        if not a.volumes:
            return a
        if self.volumes is None:
            raise RuntimeFailure("runtime_error", "this agent keeps no persistent volumes")
        ready = tuple(
            replace(v, source=str(self.volumes.ensure(v.id, v.size_mib))) for v in a.volumes
        )
        return replace(a, volumes=ready)

    def _running(self, handle) -> None:
        host = self._bound(self.assignment).pool_network.ingress_address
        ports = self.runtime.ports(handle)
        self._report(Step.RUNNING, route={"host": host, "ports": ports} if ports else None)
        self.phase = Phase.RUNNING

    # ------------------------------------------------------------------ the watch
    def _monitor(self, handle) -> None:
        """Every `poll_s`, each handler in turn looks at one thing; the first that ends the
        watch (it returns True) has dealt with the run."""
        handlers = (
            self._on_exit,
            self._on_halt,
            self._on_cancel,
            self._on_max_runtime,
            self._on_logs_due,
            self._on_checkpoint,
            self._on_usage_due,
        )
        while not any(handler(handle) for handler in handlers):
            self.cancelled.wait(self.poll_s)

    def _on_exit(self, handle) -> bool:
        """The job ended: its logs, outputs and end reported."""
        ended = self.runtime.wait(handle)
        if ended is None:
            return False
        self._finish(handle, ended)
        return True

    def _on_halt(self, handle) -> bool:
        """The agent stops: the logs so far sent, the container left for the next agent."""
        if not self.halted.is_set():
            return False
        self._flush_logs(quiet=True)
        self.phase = Phase.LEFT_RUNNING
        return True

    def _on_cancel(self, handle) -> bool:
        """The job left the assignments, or its lease is stopping: stopped and removed."""
        if not self.cancelled.is_set():
            return False
        self._stop_container(handle)
        return True

    def _on_max_runtime(self, handle) -> bool:
        """Past its maximum runtime (counted from its start, across agents): killed, failed."""
        limit = self.assignment.max_runtime_s
        if not limit or time.monotonic() - self.started_at <= limit:
            return False
        self.runtime.stop(handle, 0)
        killed = self.runtime.wait(handle)
        message = f"killed after the maximum runtime of {limit}s"
        code = killed.exit_code if killed is not None else None
        self._finish(handle, Ended.failed("max_runtime_exceeded", message, code))
        return True

    def _on_logs_due(self, handle) -> bool:
        if self._logs_due.due():
            self._flush_logs()
        return False

    def _on_checkpoint(self, handle) -> bool:
        if not self.checkpoint.is_set():
            return False
        self._checkpoint(handle)
        return True

    def _on_usage_due(self, handle) -> bool:
        if self._usage_due.due():
            self.usage = self._sample(handle) or self.usage
        return False

    def _sample(self, handle) -> dict:
        usage = dict(self.runtime.stats(handle) or {})
        if self.assignment.limits.gpus and self.gpu_usage is not None:
            usage |= self.gpu_usage(self.assignment.limits.gpus)
        return usage

    def _checkpoint(self, handle) -> None:
        """The checkpoint signal, the grace period to write $CHECKPOINT_DIR, then the stop; the
        outputs (the checkpoint with them) are uploaded and `checkpointed` reported: the control
        plane re-queues the job and releases its lease."""
        a = self.assignment
        log.info(
            "job %s: checkpoint requested (%s, grace %ss)", a.job, CHECKPOINT_SIGNAL, a.stop_grace_s
        )
        self.phase = Phase.CHECKPOINTING
        self.runtime.signal(handle, CHECKPOINT_SIGNAL)
        deadline = time.monotonic() + a.stop_grace_s
        while time.monotonic() < deadline and self.runtime.wait(handle) is None:
            if self.cancelled.wait(0.2):
                break
        ended = self.runtime.wait(handle)
        if ended is None:
            self.runtime.stop(handle, 1)
            ended = self.runtime.wait(handle)
        exited = time.monotonic()
        if self._follower is not None:
            self._follower.join(5)
        self._flush_logs()
        skipped = self._upload_outputs(handle)
        code = ended.exit_code if ended is not None else None
        message = f"checkpoint written; the job exited with {code}"
        upload_seconds = round(time.monotonic() - exited, 3)
        self._report(Step.CHECKPOINTED, message=message, upload_seconds=upload_seconds, **skipped)
        self.phase = Phase.ENDED
        self._remove(handle)
        self._clean_workdir()

    def _finish(self, handle, ended: Ended) -> None:
        exited = time.monotonic()
        if self._follower is not None:
            self._follower.join(5)
        self._flush_logs()
        skipped = self._upload_outputs(handle)
        self.outcome = ended
        self._report(
            ended.step,
            ended.reason,
            exit_code=ended.exit_code,
            message=ended.message,
            upload_seconds=round(time.monotonic() - exited, 3),  # the result upload's span
            **skipped,
        )
        self.phase = Phase.ENDED
        self._remove(handle)
        self._clean_workdir()

    def _end_quietly(self, ended: Ended) -> None:
        """An end the runner met (a runtime failure, an error of its own): the container stopped
        and removed first, then the end reported. One the runtime cannot stop is not reported:
        the job must not run on past its reported end."""
        self.outcome = ended
        if not self._discard():
            log.error("job %s: %s not reported: its container may still run", self.job, ended)
            return
        try:
            self._flush_logs(quiet=True)
            self._report(ended.step, ended.reason, exit_code=ended.exit_code, message=ended.message)
        except (Fenced, ApiError, ApiUnreachable) as exc:
            log.warning("job %s: could not report %s: %s", self.assignment.job, ended.reason, exc)
        self._clean_workdir()

    # ------------------------------------------------------------------ reports
    def _report(self, step: Step, reason: str = "", **fields) -> dict | None:
        """Only pulls and failures carry a reason; the other steps' events are implied."""
        body = {"fencing_token": self.assignment.fencing_token, "step": str(step)}
        if step in (Step.PULLING, Step.FAILED):
            body["reason"] = reason
        body |= {key: value for key, value in fields.items() if value is not None}
        body["message"] = str(body.get("message", ""))[:1000]
        log.info("job %s: %s %s", self.assignment.job, step, reason)
        began = time.monotonic()
        try:
            return self._send(step, body)
        finally:
            if self._deadline is not None:  # the wait is not the start's: not counted
                self._deadline.extend(time.monotonic() - began)

    def _send(self, step: Step, body: dict) -> dict | None:
        """The report sent until taken or refused. The agent stopping meanwhile ends the wait
        as an unreachable control plane does (ApiUnreachable): the run is left as it is, for
        the next agent, whatever the last answer was."""
        while True:
            try:
                answer = self.client.report(self.assignment.job, body)
            except ApiError as exc:
                if exc.status in (403, 404, 409):  # stale token, or no longer this node's job
                    raise Fenced(str(exc)) from exc
                if exc.status not in RETRY_STATUSES:
                    raise
                if not self._again(step, exc):
                    raise ApiUnreachable(f"{exc} (not taken; the agent stops)") from exc
            except ApiUnreachable as exc:
                if not self._again(step, exc):
                    raise
            else:
                if self._resent:
                    log.info("job %s: %s taken, sent %d times", self.job, step, self._resent + 1)
                    self._resent, self._resent_logged = 0, float("-inf")
                self.end_reported = self.end_reported or step in END_STEPS
                return answer

    def _again(self, step: Step, exc: Exception) -> bool:
        """Whether to send a report again that the control plane could not take, even after
        the client's retries (its database or Redis away for longer): yes, until it is taken or
        refused, whatever the step. Giving up would report the run a failure it was not (an end
        whose outcome is known, a pull or a start that went well); `starting` must be taken
        before the container starts anyway (the fence), and a lease that ended meanwhile is
        refused then (409: the attempt is abandoned). The agent stopping ends the wait. Its
        warning is logged the first time, then at most once every AGAIN_LOG_S with a count."""
        if self.halted.is_set():
            return False
        self._resent += 1
        now = time.monotonic()
        if now - self._resent_logged >= AGAIN_LOG_S:
            self._resent_logged = now
            log.warning(
                "job %s: %s not taken (%s): %d sends failed so far, sent again every %ss",
                self.job,
                step,
                exc,
                self._resent,
                self.report_retry_s,
            )
        return not self.halted.wait(self.report_retry_s)

    def _flush_logs(self, quiet: bool = False) -> None:
        text = self._follower.take() if self._follower is not None else ""
        for start in range(0, len(text), LOG_CHUNK):
            try:
                self.client.logs(
                    self.assignment.job,
                    self.assignment.fencing_token,
                    text[start : start + LOG_CHUNK],
                )
            except (ApiError, ApiUnreachable) as exc:
                if not quiet:
                    log.warning("job %s: logs not sent: %s", self.assignment.job, exc)
                return

    # ------------------------------------------------------------------ files
    def _prepare_dirs(self) -> None:
        """inputs/, for the job to read; /outputs is the runtime's to make (under Docker a
        filesystem of the job's output limit: worker_agent/runtime/disks.py)."""
        folder = self.workdir / "inputs"
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)

    def _fetcher(self, deadline: Deadline) -> inputs.Fetcher:
        """The inputs, fetched where the runtime says (the job's own network namespace), within
        the startup deadline (worker_agent/inputs.py)."""
        a = self.assignment
        fetcher = inputs.Fetcher.for_attempt(a, self.workdir, self.client.base)
        return replace(
            fetcher,
            run=lambda netns: self._before(deadline, "fetching inputs", lambda: fetcher.run(netns)),
        )

    def _upload_outputs(self, handle) -> dict:
        """What the stopped container left in /outputs, read through the runtime's archive
        (worker_agent/outputs.py); the final report's fields for what was skipped."""
        token = self.assignment.fencing_token
        budget = read_budget(self.assignment.limits.output_limit_mib)
        outputs = Outputs(
            self.runtime,
            handle,
            self.client,
            self.job,
            token,
            read_max=budget,
            store=self.assignment.output_store,
            store_endpoints=self.assignment.pool_network.object_store_endpoints,
        )
        try:
            outputs.upload()
        except (ApiError, ApiUnreachable, RuntimeFailure, OSError, tarfile.TarError) as exc:
            log.warning("job %s: outputs not (all) uploaded: %s", self.job, exc)
        return outputs.report()

    def _clean_workdir(self) -> None:
        disks.delete(self.workdir)

    @property
    def job(self) -> int:
        return self.assignment.job

    def _before(self, deadline: Deadline, what: str, work):
        """`work()` in a helper thread, given until the startup deadline (a hung pull or
        download cannot hold the job forever); its result, or its exception re-raised."""
        result: dict = {}

        def call():
            try:
                result["value"] = work()
            except BaseException as exc:
                result["error"] = exc

        helper = threading.Thread(target=call, daemon=True, name=f"job-{self.job}-{what}")
        helper.start()
        while helper.is_alive():
            remaining = deadline.remaining()
            if remaining <= 0:
                raise RuntimeFailure("startup_timed_out", f"{what} exceeded the startup timeout")
            if self.halted.is_set() or self.cancelled.is_set():
                raise Fenced(f"stopped while {what}")
            helper.join(min(remaining, 0.5))
        if "error" in result:
            raise result["error"]
        return result.get("value")
