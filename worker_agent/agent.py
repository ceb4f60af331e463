"""The agent's main loop (docs/data-plane.md, "The agent"): enroll once, report the inventory,
reconcile what a previous agent left running, then every `poll_s` — or at once when the control
plane pushes a change (a thread long-polls `agent/assignments/wait`) — read the assignments
(start a runner for each new one, cancel the runners whose job left) and every
`heartbeat_interval_s` heartbeat with the workloads, the local image cache and the runtime. The
credential is rotated when the heartbeat says so or half its lifetime has passed."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from worker_agent import __version__, input_cache
from worker_agent.client import ApiClient, ApiError, ApiUnreachable
from worker_agent.host import Host, cpu_features
from worker_agent.identity import KeyRefused, NodeKey, default_key_file
from worker_agent.inventory import storage_report
from worker_agent.metrics import AgentMetrics
from worker_agent.mig import MigRefused, apply_layout
from worker_agent.mps import MpsDaemons
from worker_agent.probe import probe_result, recovery_result
from worker_agent.runner import Phase, Runner
from worker_agent.runtime.base import Assignment, RuntimeUnconfigured
from worker_agent.runtime.docker import DockerRuntime, GVisorRuntime
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.runtime.protocol import Runtime
from worker_agent.state import AgentState
from worker_agent.volumes import Volumes
from worker_agent.workroot import WorkRoot, WorkRootError, default_work_root

log = logging.getLogger(__name__)

PROBE_KINDS = ("validation", "recovery")  # what the agent answers (docs/nodes.md)
PUSH_WAIT_S = 25.0  # one long poll for a push; the control plane allows 1–30 s
PUSH_BACKOFF_S, PUSH_BACKOFF_MAX_S = 0.5, 15.0  # after a failed or too quick wait
# How often the loop looks for runs on this host that no runner follows (Agent.follow_strays)
STRAY_LOOK_S = 60.0
STRAY_GRACE_S = 10  # the stop grace of a run no longer assigned (as at start)


def _stop_and_remove(runtime: Runtime, run) -> None:
    """A run found here and no longer assigned: stopped (its grace) and removed."""
    if run.running:
        runtime.stop(run.handle, STRAY_GRACE_S)
    runtime.remove(run.handle)


class AgentError(Exception):
    """The agent cannot go on (no credential and no enrollment token, credential refused)."""


class EngineUnavailable(AgentError):
    """`--runtime docker` and no engine answers yet: a passing state (dockerd restarting, slow
    after boot), not a configuration error — the agent exits 1, which its unit restarts."""


@dataclass
class Config:
    api: str
    state_dir: str
    ca_file: str = ""  # the CA bundle that verifies the API's certificate ("": the system's)
    work_dir: str = ""  # the work root (default `<state dir>.work`): never inside the state dir
    enroll_token: str = ""
    runtime: str = "auto"  # auto | docker | process
    pause_image: str = ""  # the Docker runtime's (else WORKER_AGENT_PAUSE_IMAGE; one is needed)
    node_name: str = ""
    pool: str = ""
    address: str = ""  # where this node's published ports are reached (routes)
    poll_s: float = 2.0
    heartbeat_interval_s: float = 15.0
    push: bool = True  # long-poll for pushed changes between polls (polls go on regardless)
    # the agent's own /metrics on metrics_address:metrics_port (worker_agent/metrics.py); 0: off
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    # the node's private key (worker_agent/identity.py); default `<state dir>.key/node.key`,
    # never inside the state dir or the work root
    key_file: str = ""


def default_node_name() -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:100].lstrip("._-")
    return name or "node"


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            return Path(path).read_text().strip()[:100]
        except OSError:
            continue
    return ""


def make_runtimes(
    choice: str, work: WorkRoot, pause_image: str = "", mps: MpsDaemons | None = None
) -> dict[str, Runtime]:
    """The runtimes this agent offers, the primary first. `process` is always present for the
    pools that allow it (the control plane sends runtime "process" nowhere else); `gvisor` beside
    `docker` where the engine has gVisor's two runsc runtimes. Their owner is set once the agent
    knows who it is (Agent.start). An engine that answers without a pause image configured is
    an AgentError: the agent does not start rather than offer less than it could."""
    runtimes: dict[str, Runtime] = {}
    if choice in ("auto", "docker"):
        if DockerRuntime.available():
            try:
                runtimes["docker"] = DockerRuntime(pause_image=pause_image or None, mps=mps)
            except RuntimeUnconfigured as exc:
                raise AgentError(str(exc)) from exc
            if GVisorRuntime.available():
                runtimes["gvisor"] = GVisorRuntime(pause_image=pause_image or None)
            else:
                log.info("gvisor not offered: dockerd has no runsc-none and runsc-netns runtimes")
        elif choice == "docker":
            raise EngineUnavailable("--runtime docker, but no Docker engine answers (yet)")
        else:
            log.warning("no Docker engine answers: only the local process runtime (NOT isolating)")
    runtimes["process"] = ProcessRuntime(work_dir=work.dir)
    return runtimes


def load_key(path, outside: tuple) -> NodeKey:
    """The node's key at `path` (made on first start), which must lie outside the state dir
    and the work root (`outside`): no job's mount may reach it."""
    path = Path(path).absolute()
    for root in outside:
        root = Path(root).resolve()
        if path.resolve() == root or root in path.resolve().parents:
            raise AgentError(f"the key file {path} must not be inside {root}")
    try:
        return NodeKey.load_or_create(path)
    except (KeyRefused, OSError) as exc:
        raise AgentError(f"node key: {exc}") from exc


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        runtimes: dict[str, Runtime] | None = None,
        host: Host | None = None,
    ):
        self.config = config
        self.stop_event = threading.Event()
        self.pushed = threading.Event()  # a push (or a stop) ends the wait between two syncs
        self.push_thread: threading.Thread | None = None
        self.state = AgentState(config.state_dir)
        try:
            work_dir = config.work_dir or default_work_root(config.state_dir)
            self.work = WorkRoot(work_dir, self.state.dir)
        except WorkRootError as exc:
            raise AgentError(str(exc)) from exc
        key_file = config.key_file or default_key_file(config.state_dir)
        self.key = load_key(key_file, (self.work.dir, self.state.dir))
        self.client = ApiClient(
            config.api, self.state, key=self.key, stop=self.stop_event, ca_file=config.ca_file
        )
        self.volumes = Volumes(self.work.dir)  # persistent volumes: outside every attempt
        self.host = host or Host(self.work.dir)  # the disk jobs write to
        # the node's input cache, under the state dir, never mounted (docs/storage.md)
        self.input_cache = input_cache.configure(self.state.dir / "input-cache")
        self.node_name = (
            config.node_name or self.state.info().get("node_name") or (default_node_name())
        )
        # the MPS control daemons of the GPUs that MPS leases use (worker_agent/mps.py): their
        # logs under the state dir, never mounted
        self.mps = MpsDaemons(None, self.state.dir / "mps")
        self.runtimes = runtimes or make_runtimes(
            config.runtime, self.work, config.pause_image, mps=self.mps
        )
        self.primary = next(iter(self.runtimes.values()))
        self.address = config.address or default_address()
        self.heartbeat_interval = config.heartbeat_interval_s
        self.runners: dict[tuple[int, int], Runner] = {}
        self.finished: set[tuple[int, int]] = set()  # ended here; never started again
        self.next_stray_look = time.monotonic() + STRAY_LOOK_S
        self.stray_remover: threading.Thread | None = None
        self.rotate_requested = False
        self.probes_started: set[int] = set()  # probes run (or running) by this agent
        self.mig_layouts_tried: set[tuple[str, str]] = set()  # (GPU, layout) asked and tried
        self.metrics = AgentMetrics(workloads=lambda: len(self.runners))

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        if self.config.metrics_port:
            port = self.metrics.serve(self.config.metrics_port, self.config.metrics_address)
            log.info("metrics on http://%s:%s/metrics", self.config.metrics_address, port)
        self.start()
        if self.config.push:
            self.push_thread = threading.Thread(
                target=self.listen_for_pushes, daemon=True, name="assignments-push"
            )
            self.push_thread.start()
        next_heartbeat = 0.0
        while not self.stop_event.is_set():
            self.pushed.clear()  # a push from here on brings the next sync forward
            try:
                if time.monotonic() >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = time.monotonic() + self.heartbeat_interval
                self.sync()
            except ApiUnreachable as exc:
                log.warning("control plane unreachable: %s", exc)
            except ApiError as exc:
                if exc.status == 401:
                    raise AgentError(f"the node credential is refused: {exc}") from exc
                log.warning("%s", exc)
            self.pushed.wait(self.config.poll_s)  # whichever first: a push or the poll
        self.shutdown()

    def listen_for_pushes(self) -> None:
        """Long-poll the control plane for pushes; each one sets `pushed`, which wakes the run
        loop. A push is only a hint: a lost one (an error, a timeout, a nudge between two
        waits) costs at most one poll. A control plane without the endpoint (404): polls only."""
        backoff = PUSH_BACKOFF_S
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                changed = self.client.wait_assignments(PUSH_WAIT_S)
            except ApiError as exc:
                if exc.status in (404, 405):
                    log.info(
                        "the control plane pushes nothing: polling every %ss", self.config.poll_s
                    )
                    return
                log.debug("waiting for a push: %s", exc)
            except Exception as exc:  # unreachable, a broken answer …: retried after a pause
                log.debug("waiting for a push: %s", exc)
            else:
                if changed:
                    self.pushed.set()
                    backoff = PUSH_BACKOFF_S
                    continue
                if time.monotonic() - started >= 1:  # a full wait: ask again at once
                    backoff = PUSH_BACKOFF_S
                    continue
            self.stop_event.wait(backoff)
            backoff = min(PUSH_BACKOFF_MAX_S, backoff * 2)

    def start(self) -> None:
        """Enroll if needed, report the inventory, reconcile what runs here."""
        self.enroll_if_needed()
        owner = self.state.owner()
        if owner is None:
            raise AgentError("the control plane did not say its id: containers cannot be owned")
        for runtime in self.runtimes.values():
            runtime.owner = owner  # what it creates, finds and removes is this node's only
        try:
            self.client.inventory(self.host.inventory())
        except ApiError as exc:
            log.warning("inventory not accepted: %s", exc)
        self.reconcile()

    def stop(self) -> None:
        """From a signal handler: end the loops; containers keep running."""
        self.stop_event.set()
        self.pushed.set()

    def shutdown(self) -> None:
        for runner in self.runners.values():
            runner.halt()
        for runner in self.runners.values():
            runner.join(10)
        # the MPS daemons of containers left running stay for them (and the next agent)
        self.keep_mps(only=lambda r: r.phase == Phase.LEFT_RUNNING, supervise=False)
        self.host.close()
        self.metrics.close()
        log.info("agent stopped; %d workload(s) left to the next agent", len(self.runners))

    # ------------------------------------------------------------------ identity
    def enroll_if_needed(self) -> None:
        if self.state.credential():
            try:
                node = self.client.me()
            except ApiError as exc:
                if exc.status == 401:
                    raise AgentError(
                        f"the stored credential is refused ({exc}); an operator can reissue one, "
                        f"or remove {self.state.dir} to enroll again"
                    ) from exc
                raise
            control_plane = node.get("control_plane")
            stored = self.state.info().get("control_plane")
            if stored and control_plane and stored != control_plane:
                raise AgentError(
                    f"{self.state.dir} belongs to control plane {stored}, not to {control_plane} "
                    "at this address: give each control plane's node a state dir of its own"
                )
            self.state.save_node(node, control_plane)
            self._check_pool(node)
            log.info("node %s (%s) resumes", node.get("name"), node.get("id"))
            return
        if not self.config.enroll_token:
            raise AgentError(
                "not enrolled: give --enroll-token-file (or WORKER_AGENT_ENROLL_TOKEN)"
            )
        body = {
            "token": self.config.enroll_token,
            "public_key": self.key.public_key,
            "name": self.node_name,
            "machine_id": machine_id(),
            "agent_version": __version__,
            "inventory": self.host.inventory(),
            "runtimes": list(self.runtimes),
            **self.host.describe(),
        }
        answer = self.client.enroll(body)
        self.state.save_credential(answer)
        self.state.save_node(answer["node"], answer.get("control_plane"))
        self.heartbeat_interval = float(answer.get("heartbeat_interval_s") or 15)
        self._check_pool(answer["node"])
        log.info("enrolled as node %s (%s)", answer["node"]["name"], answer["node"]["id"])

    def _check_pool(self, node: dict) -> None:
        if self.config.pool and node.get("pool") and node["pool"] != self.config.pool:
            log.warning("node is in pool %s, not %s as configured", node["pool"], self.config.pool)

    def rotate_key(self) -> None:
        """Replaces the node's key: the new one is written beside the old as `<key>.new`, the
        control plane binds it (asked with the old key, proved with the new one), and only then
        does it take the old one's place. A crash in between leaves `<key>.new`, which the next
        rotation replaces."""
        path = self.key.path
        pending = path.with_name(path.name + ".new")
        pending.unlink(missing_ok=True)
        new = NodeKey.load_or_create(pending)
        self.client.rotate_key(new)
        os.replace(pending, path)
        self.key = new
        log.info("node key rotated: %s…", new.fingerprint[:16])

    def rotate_credential(self) -> None:
        self.state.save_credential(self.client.rotate_credential())
        self.rotate_requested = False
        log.info("node credential rotated")

    # ------------------------------------------------------------------ heartbeat
    def storage(self, image_sizes: dict | None) -> dict:
        """The heartbeat's disk, caches and downloads (docs/storage.md); {} when the disk
        cannot be read (the heartbeat goes on without them)."""
        try:
            return storage_report(
                root=self.work.dir, image_sizes=image_sizes or {}, cache=self.input_cache
            )
        except OSError as exc:
            log.warning("storage report left out: %s", exc)
            return {}

    def heartbeat(self) -> dict:
        self.reap()
        sizes = getattr(self.primary, "image_sizes", None)  # the Docker runtimes'
        image_sizes = sizes() if sizes is not None else None
        workloads = [w for w in (r.workload() for r in self.runners.values()) if w]
        body = {
            "agent_version": __version__,
            "usage": self.host.usage(),
            "gpus": self.host.gpu_health(),
            "workloads": workloads,
            "images": list(image_sizes) if image_sizes is not None else self.primary.images(),
            "runtime": self.primary.name,
            "runtimes": list(self.runtimes),
            "features": cpu_features(),  # a migrated VM may have gained or lost some
        }
        body |= self.storage(image_sizes)
        answer = self.client.heartbeat(body) or {}
        self.metrics.heartbeat_taken()
        if answer.get("heartbeat_interval_s"):
            self.heartbeat_interval = float(answer["heartbeat_interval_s"])
        if answer.get("rotate_credential"):
            self.rotate_requested = True
        if self.rotate_requested or self.state.credential_due_for_rotation():
            self.rotate_credential()
        self.run_probes(answer.get("probes") or [])
        self.apply_mig_layouts(answer.get("mig_layouts") or [])
        self.reconcile_volumes()
        return answer

    def reconcile_volumes(self) -> None:
        """The volumes held here, reported; the deleted or expired ones removed (a control
        plane without the endpoint, 404: nothing to do)."""
        try:
            self.volumes.reconcile(self.client)
        except ApiError as exc:
            if exc.status not in (404, 405):
                log.warning("volumes not reconciled: %s", exc)

    # ------------------------------------------------------------------ MIG layouts
    def apply_mig_layouts(self, requests: list) -> None:
        """Carve each idle GPU the control plane asks about into its requested MIG layout
        (worker_agent/mig.py apply_layout: root, MIG mode, no instance in use, else refused),
        once per request, then report the new inventory. UNVERIFIED ON HARDWARE."""
        if not isinstance(requests, list) or self.host.nvml is None:
            return
        changed = False
        for request in requests[:8]:
            if not isinstance(request, dict):
                continue
            gpu, layout = str(request.get("gpu", ""))[:80], request.get("layout")
            key = (gpu, json.dumps(layout, sort_keys=True, default=str)[:2000])
            if key in self.mig_layouts_tried:
                continue
            self.mig_layouts_tried.add(key)
            held = {d for r in self.runners.values() for d in r.assignment.limits.gpus}
            if any(gpu in d for d in held):  # a job of this node uses the GPU: never
                log.warning("MIG layout of %s not changed: a job uses it", gpu)
                continue
            try:
                calls = apply_layout(self.host.nvml, gpu, layout)
            except MigRefused as exc:
                log.warning("MIG layout of %s refused: %s", gpu, exc.message)
                continue
            except Exception as exc:  # an NVML error midway: reported through the inventory
                log.warning("MIG layout of %s failed: %s", gpu, exc)
                changed = True
                continue
            log.info("MIG layout of %s: %s", gpu, ", ".join(calls))
            changed = True
        if changed:
            try:
                self.client.inventory(self.host.inventory())
            except Exception as exc:  # the reconciliation sweep reads the next report
                log.warning("inventory after a MIG change not accepted: %s", exc)

    # ------------------------------------------------------------------ probes
    def run_probes(self, probes: list) -> None:
        """Each requested probe once, in a thread of its own (heartbeats go on): a validation
        probe runs its challenge, a recovery probe measures its device again. A result that
        could not be delivered (control plane unreachable) is tried again when listed again."""
        for probe in probes:
            if not isinstance(probe, dict) or probe.get("kind") not in PROBE_KINDS:
                continue
            try:
                probe_id = int(probe["id"])
            except (KeyError, TypeError, ValueError):
                continue
            if probe_id in self.probes_started:
                continue
            self.probes_started.add(probe_id)
            threading.Thread(
                target=self._probe, args=(probe,), daemon=True, name=f"probe-{probe_id}"
            ).start()

    def probe_answer(self, probe: dict) -> dict:
        """The result of one probe, by its kind."""
        workdir = self.work.probe_dir(probe["id"])
        if probe["kind"] == "recovery":
            docker = self.runtimes.get("docker")  # the device container needs the engine
            return recovery_result(probe, nvml=self.host.nvml, runtime=docker, workdir=workdir)
        return probe_result(
            probe, runtime=self.primary, workdir=workdir, inventory=self.host.inventory()
        )

    def _probe(self, probe: dict) -> None:
        probe_id, kind = int(probe["id"]), probe["kind"]
        log.info("%s probe %s: running", kind, probe_id)
        try:
            result = self.probe_answer(probe)
            answer = self.client.probe_result(probe_id, result)
            log.info("%s probe %s: %s", kind, probe_id, (answer or {}).get("state"))
        except ApiUnreachable as exc:
            self.probes_started.discard(probe_id)  # the next listing tries again
            log.warning("%s probe %s: result not delivered: %s", kind, probe_id, exc)
        except ApiError as exc:
            log.warning("%s probe %s: result not accepted: %s", kind, probe_id, exc)
        except Exception:  # never let the thread die silently
            log.exception("%s probe %s failed", kind, probe_id)

    # ------------------------------------------------------------------ assignments
    def assignments(self) -> dict[tuple[int, int], Assignment]:
        parsed = {}
        for item in self.client.assignments():
            try:
                assignment = Assignment.parse(item)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("assignment skipped, unreadable: %s", exc)
                continue
            parsed[assignment.key] = assignment
        return parsed

    def sync(self) -> None:
        """Start what is new, stop what left or is stopping (cancelled); forget what ended."""
        self.reap()
        current = self.assignments()
        for key, runner in self.runners.items():
            stopping = key in current and current[key].state == "stopping"
            if (key not in current or stopping) and not runner.cancelled.is_set():
                runner.cancel()
            elif key in current and current[key].checkpoint_requested:
                runner.request_checkpoint()
        self.finished &= set(current)
        for key, assignment in current.items():
            if key not in self.runners and key not in self.finished:
                self._start_runner(assignment)
        if time.monotonic() >= self.next_stray_look:
            self.next_stray_look = time.monotonic() + STRAY_LOOK_S
            self.follow_strays(current)
        self.keep_mps()

    def follow_strays(self, current: dict[tuple[int, int], Assignment]) -> None:
        """Runs on this host that no runner follows. A runner that ended while the engine
        refused to stop or remove its container, or that lost the control plane in the middle
        of a restore, leaves its run behind (before, until the agent's next restart). One of a
        current assignment is followed again, as reconciliation adopts it (worker_agent/runner.py
        decides: reported, launched afresh, or stopped and removed); any other is stopped and
        removed, in a thread of its own (its stop grace)."""
        strays = []
        for runtime in self.runtimes.values():
            try:
                found = runtime.find(tidy=False)
            except Exception:  # the engine away: looked for again next time
                log.exception("runtime %s: its runs could not be listed", runtime.name)
                continue
            for run in found:
                key = (run.job, run.lease)
                if key in self.runners:
                    continue
                assignment = current.get(key)
                if assignment is not None and assignment.runtime == runtime.name:
                    log.warning("job %s: its run is here and nothing follows it: adopted", run.job)
                    self.finished.discard(key)
                    self._start_runner(assignment, found=run)
                else:
                    strays.append((runtime, run))
        if strays and not (self.stray_remover and self.stray_remover.is_alive()):
            self.stray_remover = threading.Thread(
                target=self._remove_strays, args=(strays,), daemon=True, name="strays"
            )
            self.stray_remover.start()

    def _remove_strays(self, strays: list) -> None:
        for runtime, run in strays:
            log.warning(
                "job %s (lease %s): its run is still here, no longer assigned: removing",
                run.job,
                run.lease,
            )
            try:
                _stop_and_remove(runtime, run)
                self.work.remove_attempt(run.job, run.attempt)
            except Exception:  # one refused removal never stops the others
                log.exception("job %s: its run could not be removed (tried again)", run.job)

    def keep_mps(self, only=None, supervise: bool = True) -> None:
        """The MPS daemons of the GPUs that this node's MPS runs use kept (one that died
        started again), the others stopped (worker_agent/mps.py)."""
        gpus = {
            share.gpu
            for runner in self.runners.values()
            if only is None or only(runner)
            for share in runner.assignment.limits.mps
        }
        try:
            self.mps.retain(gpus)
            if supervise:
                self.mps.supervise()
        except Exception:  # never the loop's end
            log.exception("MPS daemons not supervised")

    def reconcile(self) -> None:
        """What a previous agent left (worker_agent/runner.py `Runner.run` decides each):
        - a container (or process) of no current assignment, or of another runtime: stopped
          and removed;
        - one of a current assignment: adopted. Its lease stopping (the job cancelled) → stopped,
          removed and `stopped` reported; created and never started (the agent died between
          create and start) → removed and, the job `leased` or `starting`, the attempt launched
          afresh under the same lease (reported further: failed `runtime_error`); running or
          exited → `running` reported where the job was `leased` or `starting`, then followed
          to its end, which is reported (an exited one's at once);
        - a current assignment with nothing found: `leased` → launched; `starting` (the agent
          died after that report and before the create) → launched afresh under the same
          lease, since nothing of it ran; `stopping` → `stopped` reported; any other state
          (`running`, `checkpointing`) → failed `runtime_error`, "the container is gone"; a
          runtime this agent does not offer → failed `runtime_unavailable`.
        The attempt directories of everything not adopted are deleted first."""
        current = self.assignments()
        adopted = []
        for runtime in self.runtimes.values():
            for found in runtime.find():
                assignment = current.get((found.job, found.lease))
                if assignment is None or assignment.runtime != runtime.name:
                    log.info(
                        "job %s (lease %s) no longer assigned: removing", found.job, found.lease
                    )
                    _stop_and_remove(runtime, found)
                    continue
                adopted.append((assignment, found))
        # the directories (and filesystems) of every attempt not adopted are leftovers
        self.work.sweep(keep={self.work.attempt_path(a.job, a.attempt) for a, _ in adopted})
        for assignment, found in adopted:
            self._start_runner(assignment, found=found)
        for assignment in current.values():
            if assignment.key not in self.runners:
                self._start_runner(assignment)

    def _start_runner(self, assignment: Assignment, found=None) -> None:
        runtime = self.runtimes.get(assignment.runtime)
        runner = Runner(
            assignment,
            client=self.client,
            runtime=runtime,  # None: reported failed runtime_error, nothing started
            workdir=self.work.attempt_dir(assignment.job, assignment.attempt),
            address=self.address,
            found=found,
            gpu_usage=self.host.gpu_usage,
            metrics=self.metrics,
            volumes=self.volumes,
        )
        if found is None:  # a new attempt, not one a previous agent left running
            self.metrics.taken_up(assignment.leased_at)
        self.runners[assignment.key] = runner
        runner.start()

    def reap(self) -> None:
        for key in [key for key, runner in self.runners.items() if not runner.is_alive()]:
            runner = self.runners.pop(key)
            if not runner.halted.is_set():
                self.finished.add(key)
