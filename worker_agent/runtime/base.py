"""What both runtimes share: an assignment as the control plane sends it (docs/data-plane.md,
`GET /api/v1/agent/assignments`), how a run ended, and the failure a runtime raises."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from worker_agent.logs import valid_traceparent
from worker_agent.mps import MpsShare

DIGEST_MARK = "@sha256:"
# label prefix: computepool.job, .lease, .attempt, .node (its name, for people), .node_id and
# .control_plane (who owns the container: the only labels an agent trusts, see Owner)
LABEL = "computepool"
# A requested checkpoint: the job gets this signal, has its stop grace period to write its state
# into $CHECKPOINT_DIR (outputs/checkpoint, uploaded with the outputs as checkpoint.tar), then
# it is stopped (docs/data-plane.md, "Checkpoints").
CHECKPOINT_SIGNAL = "SIGUSR1"
CHECKPOINT_SUBDIR = "checkpoint"
JOB_USER_ID = 65534  # nobody: the containers' user and group, owner of what is given to them
WAIT_STEP_S = 0.05  # between two looks of a runtime's `wait`


class Step(StrEnum):
    """What the agent reports of a run (`POST /api/v1/agent/jobs/{id}/report`): the control
    plane's jobs/lifecycle.py STEPS, the same strings."""

    PULLING = "pulling"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CHECKPOINTED = "checkpointed"
    STOPPED = "stopped"


# A run's last report: its end, its checkpoint, or a cancelled run's confirmation (END_STEPS)
END_STEPS = frozenset({Step.SUCCEEDED, Step.FAILED, Step.CHECKPOINTED, Step.STOPPED})


class RuntimeUnconfigured(Exception):
    """A runtime cannot be offered as configured: the agent does not start."""


class RuntimeFailure(Exception):
    """A run cannot go on; `reason` is the failure reason the agent reports (image_invalid,
    image_pull_failed, startup_timed_out, runtime_error)."""

    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message
        super().__init__(f"{reason}: {message}")


@dataclass(frozen=True)
class Owner:
    """Whose containers a runtime creates, finds and removes: one node of one control plane.

    Several agents may share one Docker engine (two control planes on one machine, or two nodes
    of one). An agent touches only what carries both its control-plane id and its node id as
    labels, never a container by its name alone; names start with the control-plane id, so
    two control planes never pick the same one (job and lease ids are unique within each)."""

    control_plane: str  # the control plane's UUID, learned at enrollment
    node_id: int
    node_name: str = ""

    def __post_init__(self):
        # a UUID in its canonical form, or ValueError: it goes into names and label filters
        object.__setattr__(self, "control_plane", str(uuid.UUID(str(self.control_plane))))
        object.__setattr__(self, "node_id", int(self.node_id))

    @property
    def prefix(self) -> str:
        """The start of every container and volume name of this control plane."""
        return f"{LABEL}-{self.control_plane}"

    def labels(self) -> dict[str, str]:
        return {
            f"{LABEL}.control_plane": self.control_plane,
            f"{LABEL}.node_id": str(self.node_id),
            f"{LABEL}.node": self.node_name,
        }

    def label_filters(self) -> list[str]:
        """The engine's label filter for what this owner made."""
        return [f"{LABEL}.control_plane={self.control_plane}", f"{LABEL}.node_id={self.node_id}"]

    def owns(self, labels: dict | None) -> bool:
        labels = labels or {}
        return labels.get(f"{LABEL}.control_plane") == self.control_plane and labels.get(
            f"{LABEL}.node_id"
        ) == str(self.node_id)


@dataclass(frozen=True)
class Limits:
    cpu_millicores: int = 1000
    memory_mib: int = 1024
    scratch_mib: int = 0
    output_limit_mib: int = 0  # /outputs is a filesystem of this size (0: no limit)
    # /scratch in RAM (a tmpfs of scratch_mib, counted against the memory limit): the agent's
    # own validation probes only, which prove memory by filling it; never from an assignment
    scratch_in_memory: bool = False
    pids: int = 1024
    cpuset: str | None = None  # the kernel's cpulist form, "0-3,8"
    gpus: tuple[str, ...] = ()  # exact device UUIDs (GPU-…) or MIG instances (MIG-…)
    # exclusive | mig | shared-not-isolated (time-slice/MPS) | none: a container label
    gpu_isolation: str = "none"
    # an MPS share's caps per device (worker_agent/mps.py); () for every other class
    mps: tuple[MpsShare, ...] = ()
    # ((MIG slot identifier, leased profile), ...): checked through NVML before start
    mig_profiles: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, data: dict | None) -> Limits:
        data = data or {}
        cpuset = data.get("cpuset")
        if isinstance(cpuset, list | tuple):
            cpuset = ",".join(str(int(cpu)) for cpu in cpuset)
        return cls(
            cpu_millicores=int(data.get("cpu_millicores") or 1000),
            memory_mib=int(data.get("memory_mib") or 1024),
            scratch_mib=int(data.get("scratch_mib") or 0),
            output_limit_mib=int(data.get("output_limit_mib") or 0),
            pids=int(data.get("pids") or 1024),
            cpuset=str(cpuset) if cpuset else None,
            gpus=tuple(str(gpu) for gpu in data.get("gpus") or ()),
            gpu_isolation=str(data.get("gpu_isolation") or "none")[:32],
            mps=MpsShare.parse_all(data.get("mps")),
            mig_profiles=_mig_profiles(data.get("mig_profiles")),
        )


def _mig_profiles(data) -> tuple[tuple[str, str], ...]:
    """The assignment's `limits.mig_profiles` ({MIG slot identifier: leased profile})."""
    if not isinstance(data, dict):
        return ()
    return tuple((str(k)[:200], str(v)[:40]) for k, v in list(data.items())[:64])


@dataclass(frozen=True)
class PoolNetwork:
    """The pool's network knobs, as the assignment's `pool_network` carries them
    (docs/data-plane.md): private ranges allowed or not, the bound of a job's egress
    (`egress_allowed`: CIDRs and host names), where published ports bind (`ingress_address`:
    an address, or "node" for the agent's own route address), the addresses the control plane
    knows to refuse (its own, its nodes'), and the object-store origins whose presigned inputs
    are exempt from the loopback rule."""

    private_ranges_allowed: bool = False
    egress_allowed: tuple[str, ...] = ()
    ingress_address: str = "127.0.0.1"
    refused: tuple[str, ...] = ()
    object_store_endpoints: tuple[str, ...] = ()

    @classmethod
    def parse(cls, data: dict | None) -> PoolNetwork:
        data = data or {}
        return cls(
            private_ranges_allowed=data.get("private_ranges_allowed") is True,
            egress_allowed=_strings(data.get("egress_allowed")),
            ingress_address=str(data.get("ingress_address") or "127.0.0.1"),
            refused=_strings(data.get("refused")),
            object_store_endpoints=_strings(data.get("object_store_endpoints")),
        )


def _output_store(data) -> dict | None:
    """The assignment's `output_store` when it names a kind the agent knows (else None: the
    outputs go to the control plane, as before)."""
    if isinstance(data, dict) and data.get("kind") == "s3":
        return {"kind": "s3", "location": str(data.get("location") or "")}
    return None


def _strings(items) -> tuple[str, ...]:
    return tuple(str(item) for item in items or ())


@dataclass(frozen=True)
class VolumeMount:
    """One persistent volume of the job (docs/storage.md "Persistent volumes"): the control
    plane's volume id, its size, where the job sees it and how; `source` is the host folder
    its filesystem is mounted at, set by the runner once the volume is there
    (worker_agent/volumes.py)."""

    id: int
    size_mib: int
    path: str
    read_only: bool = False
    source: str = ""

    @classmethod
    def parse_all(cls, items) -> tuple[VolumeMount, ...]:
        return tuple(
            cls(
                id=int(item["id"]),
                size_mib=int(item.get("size_mib") or 0),
                path=str(item["path"]),
                read_only=item.get("read_only") is True,
            )
            for item in items or ()
            if isinstance(item, dict)
        )


@dataclass(frozen=True)
class Assignment:
    job: int
    attempt: int
    lease: int
    fencing_token: str
    image: str
    command: tuple[str, ...] = ()
    name: str = ""
    tenant: str = ""
    state: str = "leased"
    env: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict, repr=False)  # NAME → value: never logged
    inputs: tuple[dict, ...] = ()
    ports: tuple[int, ...] = ()
    network_mode: str = "none"
    egress_allow: tuple[str, ...] = ()
    ingress_allow: tuple[str, ...] = ()  # source CIDRs of the published ports (none: any)
    pool_network: PoolNetwork = field(default_factory=PoolNetwork)
    max_runtime_s: int | None = None
    startup_timeout_s: int = 300
    stop_grace_s: int = 10
    runtime: str = "docker"
    limits: Limits = field(default_factory=Limits)
    checkpoint_requested: bool = False
    volumes: tuple[VolumeMount, ...] = ()  # its persistent volumes
    # The checkpoint of an earlier attempt to unpack into $CHECKPOINT_DIR before start:
    # {"url", "sha256"} (docs/data-plane.md, "Checkpoints"), or None.
    restore: dict | None = None
    # the job's W3C trace context, sent back on every report and upload of the job
    traceparent: str = ""
    # when the control plane made the attempt's lease (seconds since the epoch, its clock):
    # the agent's assignment lag is measured from it
    leased_at: float | None = None
    # where outputs go when not to the control plane: {"kind": "s3", "location"} (each file
    # by a presigned PUT the control plane issues: worker_agent/outputs.py), else None
    output_store: dict | None = None

    @classmethod
    def parse(cls, data: dict) -> Assignment:
        policy = data.get("network_policy") or {}
        return cls(
            job=int(data["job"]),
            attempt=int(data.get("attempt") or 1),
            lease=int(data["lease"]),
            fencing_token=str(data["fencing_token"]),
            image=str(data.get("image") or ""),
            command=tuple(str(part) for part in data.get("command") or ()),
            name=str(data.get("name") or ""),
            tenant=str(data.get("tenant") or ""),
            state=str(data.get("state") or "leased"),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            secrets={str(k): str(v) for k, v in (data.get("secrets") or {}).items()},
            inputs=tuple(data.get("inputs") or ()),
            ports=tuple(int(port) for port in data.get("ports") or ()),
            network_mode=str(policy.get("mode") or "none"),
            egress_allow=tuple(str(rule) for rule in policy.get("egress_allow") or ()),
            ingress_allow=tuple(str(cidr) for cidr in policy.get("ingress_allow") or ()),
            pool_network=PoolNetwork.parse(data.get("pool_network")),
            max_runtime_s=int(data["max_runtime_s"]) if data.get("max_runtime_s") else None,
            startup_timeout_s=int(data.get("startup_timeout_s") or 300),
            stop_grace_s=int(
                data.get("stop_grace_s") if data.get("stop_grace_s") is not None else 10
            ),
            runtime=str(data.get("runtime") or "docker"),
            limits=Limits.parse(data.get("limits")),
            checkpoint_requested=bool(data.get("checkpoint_requested")),
            volumes=VolumeMount.parse_all(data.get("volumes")),
            restore=_restore(data.get("restore")),
            traceparent=valid_traceparent(data.get("traceparent")),
            leased_at=_epoch(data.get("leased_at")),
            output_store=_output_store(data.get("output_store")),
        )

    @property
    def key(self) -> tuple[int, int]:
        """One run: a job's lease (a new lease is a new attempt, even of the same job)."""
        return (self.job, self.lease)

    def labels(self, owner: Owner) -> dict[str, str]:
        return owner.labels() | {
            f"{LABEL}.job": str(self.job),
            f"{LABEL}.lease": str(self.lease),
            f"{LABEL}.attempt": str(self.attempt),
        }

    def environment(self, secrets_dir: str) -> dict[str, str]:
        """Plain env, and NAME_FILE for each secret: the path of the file in `secrets_dir`
        that holds its value (worker_agent/secrets.py; values are never in the environment)."""
        return {**self.env, **{f"{name}_FILE": f"{secrets_dir}/{name}" for name in self.secrets}}


def _epoch(value) -> float | None:
    """An ISO 8601 time as seconds since the epoch; None when missing or unreadable."""
    try:
        return datetime.fromisoformat(str(value)).timestamp() if value else None
    except ValueError:
        return None


def _restore(data) -> dict | None:
    if not isinstance(data, dict) or not data.get("sha256"):
        return None
    return {"url": str(data.get("url") or "")[:2000], "sha256": str(data["sha256"]).lower()}


@dataclass
class Ended:
    """How a run ended: `step` succeeded or failed, with the reason and exit code to report."""

    step: Step
    reason: str
    exit_code: int | None = None
    message: str = ""

    @classmethod
    def from_exit(cls, exit_code: int, *, oom: bool = False, message: str = "") -> Ended:
        if oom:
            return cls(Step.FAILED, "oom_killed", exit_code, message or "killed: out of memory")
        if exit_code == 0:
            return cls(Step.SUCCEEDED, "exited_zero", 0, message)
        return cls(Step.FAILED, "exited_nonzero", exit_code, message or f"exit code {exit_code}")

    @classmethod
    def failed(cls, reason: str, message: str, exit_code: int | None = None) -> Ended:
        return cls(Step.FAILED, reason, exit_code, message)


def wait_for_end(look: Callable[[], Ended | None], timeout: float) -> Ended | None:
    """A runtime's `wait`: `look()` until it tells an end or `timeout` seconds have passed."""
    deadline = time.monotonic() + max(0.0, timeout)
    while (ended := look()) is None and time.monotonic() < deadline:
        time.sleep(min(WAIT_STEP_S, max(0.0, deadline - time.monotonic())))
    return ended


@dataclass
class Found:
    """A run a runtime found on this host at start (by its labels), for reconciliation."""

    job: int
    lease: int
    attempt: int
    handle: object
    running: bool
    ended: Ended | None = None
    elapsed_s: float = 0.0  # since it started: the maximum runtime counts across agents
