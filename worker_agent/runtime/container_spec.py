"""What a job's container is made of under the Docker runtime (docs/data-plane.md, "Running a
job"): the image by digest only, the lease's limits, the hardening every container of an
attempt shares (its network owner's too), and the filesystems it writes to."""

from __future__ import annotations

import os
import re
from pathlib import Path

from docker.types import DeviceRequest, LogConfig, Mount

from worker_agent import mps as mps_daemons
from worker_agent.runtime import disks
from worker_agent.runtime import secrets as secret_files
from worker_agent.runtime.base import (
    CHECKPOINT_SUBDIR,
    JOB_USER_ID,
    LABEL,
    Assignment,
    Limits,
    RuntimeFailure,
)

DIGEST_RE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
NOBODY = f"{JOB_USER_ID}:{JOB_USER_ID}"
SECRETS_DIR = secret_files.CONTAINER_DIR
TMP_TMPFS = "rw,nosuid,nodev,size=64m"
# Every container of an attempt: user nobody, a read-only root, every capability dropped,
# no-new-privileges, never privileged, a private IPC namespace (no host namespaces at all).
HARDENED = {
    "user": NOBODY,
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "privileged": False,
    "ipc_mode": "private",
}


def json_logs(size: str, files: int) -> LogConfig:
    return LogConfig(type="json-file", config={"max-size": size, "max-file": str(files)})


def check_digest(image: str) -> None:
    if not DIGEST_RE.match(image or ""):
        raise RuntimeFailure(
            "image_invalid", f"refusing {image!r}: the agent runs images by @sha256: digest only"
        )


def disk_mounts(assignment: Assignment, workdir: Path) -> list[Mount]:
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


def volume_mounts(assignment: Assignment) -> list[Mount]:
    """The job's persistent volumes: each one's filesystem (worker_agent/volumes.py, mounted by
    the runner outside every attempt's directory) bind-mounted at the job's path, read-only
    when asked. A volume the runner did not make ready is never mounted empty."""
    mounts = []
    for volume in assignment.volumes:
        if not volume.source:
            raise RuntimeFailure("runtime_error", f"volume {volume.id} is not mounted on the node")
        mounts.append(Mount(volume.path, volume.source, type="bind", read_only=volume.read_only))
    return mounts


def inputs_mount(workdir: Path) -> Mount:
    return Mount("/inputs", str(workdir / "inputs"), type="bind", read_only=True)


def secrets_mount(source: Path) -> Mount:
    """The attempt's ramfs of secrets, read-only in the container."""
    return Mount(SECRETS_DIR, str(source), type="bind", read_only=True)


def memory_scratch(limits: Limits) -> dict:
    """A probe's /scratch: a tmpfs of its size, RAM counted against the memory limit."""
    if not (limits.scratch_in_memory and limits.scratch_mib > 0):
        return {}
    owner = f"uid={JOB_USER_ID},gid={JOB_USER_ID}"
    return {"/scratch": f"rw,nosuid,nodev,size={limits.scratch_mib}m,{owner},mode=0700"}


def mps_options(endpoint: mps_daemons.Endpoint, share: mps_daemons.MpsShare) -> dict:
    """What an MPS share's container adds (worker_agent/mps.py): its GPU's daemon's pipe folder
    at /run/nvidia-mps and the daemon's shm folder as its /dev/shm (the IPC namespace stays
    private: nothing else of the host's is shared), and its client's caps in the environment."""
    pipe = mps_daemons.CONTAINER_PIPE_DIR
    return {
        "mounts": [
            Mount(pipe, str(endpoint.pipe_dir), type="bind", read_only=False),
            Mount("/dev/shm", str(endpoint.shm_dir), type="bind", read_only=False),
        ],
        "environment": mps_daemons.client_environment(share, pipe),
        "labels": {f"{LABEL}.mps": "1"},
    }


def job_options(
    assignment: Assignment,
    *,
    name: str,
    labels: dict,
    mounts: list[Mount],
    network: dict,
    device_ids: list[str],
    engine_runtime: str | None,
    mps: dict | None = None,
) -> dict:
    """The engine's create options of the job's container, every limit of the lease; `mps`:
    an MPS share's additions (`mps_options`)."""
    limits = assignment.limits
    mps = mps or {"mounts": [], "environment": {}, "labels": {}}
    options = {
        "name": name,
        # how its GPUs are isolated, for whoever inspects the node's containers
        "labels": labels | {f"{LABEL}.gpu_isolation": limits.gpu_isolation} | mps["labels"],
        "environment": assignment.environment(SECRETS_DIR)
        | {
            "OUTPUTS_DIR": "/outputs",
            "INPUTS_DIR": "/inputs",
            "SCRATCH_DIR": "/scratch",
            "CHECKPOINT_DIR": f"/outputs/{CHECKPOINT_SUBDIR}",
        }
        | mps["environment"],  # last: the job's own env never replaces its caps here
        **HARDENED,
        "tmpfs": {"/tmp": TMP_TMPFS} | memory_scratch(limits),
        "mounts": [*mounts, *mps["mounts"]],
        "nano_cpus": limits.cpu_millicores * 1_000_000,
        "mem_limit": f"{limits.memory_mib}m",
        "memswap_limit": f"{limits.memory_mib}m",  # == memory: no extra swap
        "pids_limit": limits.pids,
        "log_config": json_logs("10m", 3),
        **network,
    }
    if assignment.command:
        options["command"] = list(assignment.command)
    if limits.cpuset:
        options["cpuset_cpus"] = limits.cpuset
    if engine_runtime:
        options["runtime"] = engine_runtime
    if limits.gpus:
        options["device_requests"] = [
            DeviceRequest(driver="nvidia", device_ids=device_ids, capabilities=[["gpu"]])
        ]
    return options
