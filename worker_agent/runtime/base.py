"""What both runtimes share: an assignment as the control plane sends it (docs/data-plane.md,
`GET /api/v1/agent/assignments`), how a run ended, and the failure a runtime raises."""

from __future__ import annotations

from dataclasses import dataclass, field

DIGEST_MARK = "@sha256:"
LABEL = "computepool"  # label prefix: computepool.job, .lease, .attempt, .node
# A requested checkpoint: the job gets this signal, has its stop grace period to write its state
# into $CHECKPOINT_DIR (outputs/checkpoint, uploaded with the outputs as checkpoint.tar), then
# it is stopped (docs/data-plane.md, "Checkpoints").
CHECKPOINT_SIGNAL = "SIGUSR1"
CHECKPOINT_SUBDIR = "checkpoint"


class RuntimeFailure(Exception):
    """A run cannot go on; `reason` is the failure reason the agent reports (image_invalid,
    image_pull_failed, startup_timed_out, runtime_error)."""

    def __init__(self, reason: str, message: str):
        self.reason, self.message = reason, message
        super().__init__(f"{reason}: {message}")


@dataclass(frozen=True)
class Limits:
    cpu_millicores: int = 1000
    memory_mib: int = 1024
    scratch_mib: int = 0
    pids: int = 1024
    cpuset: str | None = None  # the kernel's cpulist form, "0-3,8"
    gpus: tuple[str, ...] = ()  # exact device UUIDs (GPU-…) or MIG instances (MIG-…)
    # exclusive | mig | shared-not-isolated (time-slice/MPS) | none: a container label
    gpu_isolation: str = "none"

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
            pids=int(data.get("pids") or 1024),
            cpuset=str(cpuset) if cpuset else None,
            gpus=tuple(str(gpu) for gpu in data.get("gpus") or ()),
            gpu_isolation=str(data.get("gpu_isolation") or "none")[:32],
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
    secrets: dict = field(default_factory=dict)
    inputs: tuple[dict, ...] = ()
    ports: tuple[int, ...] = ()
    network_mode: str = "none"
    egress_allow: tuple[str, ...] = ()
    max_runtime_s: int | None = None
    startup_timeout_s: int = 300
    stop_grace_s: int = 10
    runtime: str = "docker"
    limits: Limits = field(default_factory=Limits)
    checkpoint_requested: bool = False
    # The checkpoint of an earlier attempt to unpack into $CHECKPOINT_DIR before start:
    # {"url", "sha256"} (docs/data-plane.md, "Checkpoints"), or None.
    restore: dict | None = None

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
            max_runtime_s=int(data["max_runtime_s"]) if data.get("max_runtime_s") else None,
            startup_timeout_s=int(data.get("startup_timeout_s") or 300),
            stop_grace_s=int(
                data.get("stop_grace_s") if data.get("stop_grace_s") is not None else 10
            ),
            runtime=str(data.get("runtime") or "docker"),
            limits=Limits.parse(data.get("limits")),
            checkpoint_requested=bool(data.get("checkpoint_requested")),
            restore=_restore(data.get("restore")),
        )

    @property
    def key(self) -> tuple[int, int]:
        """One run: a job's lease (a new lease is a new attempt, even of the same job)."""
        return (self.job, self.lease)

    def labels(self, node: str = "") -> dict[str, str]:
        return {
            f"{LABEL}.job": str(self.job),
            f"{LABEL}.lease": str(self.lease),
            f"{LABEL}.attempt": str(self.attempt),
            f"{LABEL}.node": node,
        }

    def environment(self) -> dict[str, str]:
        """Plain env, then secrets (a secret wins over a plain variable of the same name)."""
        return {**self.env, **self.secrets}


def _restore(data) -> dict | None:
    if not isinstance(data, dict) or not data.get("sha256"):
        return None
    return {"url": str(data.get("url") or "")[:2000], "sha256": str(data["sha256"]).lower()}


@dataclass
class Ended:
    """How a run ended: `step` succeeded or failed, with the reason and exit code to report."""

    step: str
    reason: str
    exit_code: int | None = None
    message: str = ""

    @classmethod
    def from_exit(cls, exit_code: int, *, oom: bool = False, message: str = "") -> Ended:
        if oom:
            return cls("failed", "oom_killed", exit_code, message or "killed: out of memory")
        if exit_code == 0:
            return cls("succeeded", "exited_zero", 0, message)
        return cls("failed", "exited_nonzero", exit_code, message or f"exit code {exit_code}")


@dataclass
class Found:
    """A run a runtime found on this host at start (by its labels), for reconciliation."""

    job: int
    lease: int
    attempt: int
    handle: object
    running: bool
    ended: Ended | None = None
