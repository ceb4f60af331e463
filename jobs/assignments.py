"""What a node should be running now (docs/data-plane.md "Assignments"): one assignment per job
whose current holding lease is on the node, built from the job, its lease, the pool's knobs and
network, its secrets (resolved now, never stored) and the checkpoint to restore. The agent's
reports about them are jobs/lifecycle.py's.
"""

from __future__ import annotations

import contextlib

from django.db.models import Q

from leases.choices import HOLDING, LeaseState
from leases.models import Lease
from nodes.models import GpuDevice
from placement.devices import mps_memory_mib, mps_thread_percentage
from pools.actors import Actor
from pools.choices import ContainerRuntime, GpuSharingClass
from pools.encryption import EncryptionError
from pools.knobs import PoolKnobs, knobs_for, runtime_below
from pools.models import TenantSecret
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from storage.mounts import assignment_volumes

from . import object_store
from .choices import JobState
from .models import Job, JobOutput
from .networks import assignment_inputs, pool_network
from .services import job_finish
from .trace import job_traceparent

S = JobState
# The states in which a job has work on its node: the agent runs (or stops) what is listed.
ON_NODE = (S.LEASED, S.STARTING, S.RUNNING, S.CHECKPOINTING)
DEFAULT_PIDS = 1024
# How a job's GPUs are isolated (limits.gpu_isolation, JobSerializer.gpu_isolation): only MIG
# fences a fraction of a device; time-slice/MPS shares see each other's memory and compute.
GPU_EXCLUSIVE, GPU_MIG, GPU_SHARED = "exclusive", "mig", "shared-not-isolated"
GPU_NONE = "none"  # no GPUs
# What the agent uploads as a checkpoint (worker_agent/runner.py) and restores into the next
# attempt (`restore` of an assignment, `GET /api/v1/agent/jobs/{id}/checkpoint`).
CHECKPOINT_OUTPUT = "checkpoint.tar"


def node_assignments(*, node, api_base: str = "") -> list[dict]:
    """One entry per job whose current holding lease is on this node and that has work here,
    and one per stopping lease (its job cancelled: `state` "stopping", no secrets, for the
    agent to stop the container and confirm). `api_base` (`https://cp.example`) prefixes the
    checkpoint's download URL."""
    leases = list(
        Lease.objects.filter(node=node)
        .filter(Q(state__in=HOLDING, job__state__in=ON_NODE) | Q(state=LeaseState.STOPPING))
        .select_related("job", "job__tenant")
        .order_by("id")
    )
    if not leases:
        return []
    knobs = knobs_for(node.pool)
    gpu_ids = {a["gpu"] for lease in leases for a in lease.gpu_allocations if a.get("gpu")}
    devices = {g.pk: g for g in GpuDevice.objects.filter(pk__in=gpu_ids, node=node)}
    wanted = {
        (lease.job.tenant_id, name)
        for lease in leases
        if lease.state != LeaseState.STOPPING
        for name in lease.job.secrets.values()
    }
    values, unreadable = {}, {}
    for secret in TenantSecret.objects.filter(
        tenant_id__in={t for t, _ in wanted}, name__in={n for _, n in wanted}
    ):
        try:
            values[(secret.tenant_id, secret.name)] = secret.reveal()
        except EncryptionError as exc:  # its key left the ring: that job fails, not the node
            unreadable[(secret.tenant_id, secret.name)] = str(exc)
    if unreadable:
        leases = [lease for lease in leases if not _failed_unreadable(lease.job, unreadable)]
    # an s3:// input whose bucket is gone fails its job (`input_unavailable`), not the node's
    leases = [
        lease
        for lease in leases
        if lease.state == LeaseState.STOPPING or not object_store.inputs_unavailable(lease)
    ]
    network = pool_network(node.pool)
    checkpoints = {}
    for output in JobOutput.objects.filter(
        job_id__in={lease.job_id for lease in leases}, name=CHECKPOINT_OUTPUT
    ).order_by("job_id", "-attempt"):
        checkpoints.setdefault(output.job_id, []).append(output)
    return [
        _assignment(lease, lease.job, node, knobs, devices, values, network)
        | (
            {"state": LeaseState.STOPPING.value, "secrets": {}, "restore": None}
            if lease.state == LeaseState.STOPPING
            else {"restore": _restore(lease.job, checkpoints.get(lease.job_id, ()), api_base)}
        )
        for lease in leases
    ]


def _failed_unreadable(job: Job, unreadable: dict) -> bool:
    """Fail a job whose secret cannot be decrypted (`secret_unreadable`, naming the secret):
    it cannot run without it, and one such row must not stop the node's other assignments."""
    names = [name for name in job.secrets.values() if (job.tenant_id, name) in unreadable]
    if not names:
        return False
    problem = unreadable[(job.tenant_id, names[0])]
    with contextlib.suppress(TransitionRefused):  # ended meanwhile: not this node's work
        job_finish(
            job=job,
            actor=Actor.system("assignments"),
            exit_code=None,
            reason=Reason.SECRET_UNREADABLE,
            message=f"secret {names[0]} cannot be decrypted: {problem}"[:1000],
        )
    return True


def job_checkpoint(job: Job, outputs=None) -> JobOutput | None:
    """The newest checkpoint an earlier attempt uploaded (the current attempt's own, written
    while it is being checkpointed, is not one to start from)."""
    if outputs is None:
        outputs = job.outputs.filter(name=CHECKPOINT_OUTPUT).order_by("-attempt")
    return next((o for o in outputs if o.attempt < job.attempts), None)


def _restore(job: Job, outputs, api_base: str) -> dict | None:
    checkpoint = job_checkpoint(job, outputs)
    if checkpoint is None:
        return None
    url = f"{api_base.rstrip('/')}/api/v1/agent/jobs/{job.pk}/checkpoint"
    return {"url": url, "sha256": checkpoint.sha256}


def assignment_runtime(job, node, knobs: PoolKnobs) -> str:
    """What the node runs the job under: gVisor when its request asks for it or the pool
    requires it (a job queued before the pool's `required_runtime` was raised runs under it
    too; a node without it refuses the job, never runs it weaker); otherwise Docker, or the
    local process runtime only where the pool allows it and the node's agent runs it."""
    requested = (job.resources or {}).get("container_runtime") or ContainerRuntime.DOCKER
    required = knobs.required_runtime
    if ContainerRuntime.GVISOR in (requested, required):
        return ContainerRuntime.GVISOR
    process = ContainerRuntime.PROCESS
    if (
        knobs.allow_process_runtime
        and node.agent_runtime == process
        and not runtime_below(process, required)
    ):
        return process
    return ContainerRuntime.DOCKER


def _assignment(lease, job, node, knobs, devices, secret_values, network) -> dict:
    return {
        "job": job.pk,
        "attempt": job.attempts,
        "lease": lease.pk,
        "fencing_token": str(lease.fencing_token),
        # the agent measures how long the attempt waited to be taken up from this
        "leased_at": lease.created_at.isoformat(),
        "name": job.name,
        "tenant": job.tenant.slug,
        "state": job.state,
        "image": job.image,
        "command": job.command,
        "env": job.env,
        # resolved now, never stored: a secret changed since submit runs with its new value
        "secrets": {
            env: secret_values[(job.tenant_id, name)]
            for env, name in job.secrets.items()
            if (job.tenant_id, name) in secret_values
        },
        "inputs": assignment_inputs(job.inputs, object_store.input_presigner(job, lease)),
        # where outputs go when not to the control plane: {"kind": "s3", "location"} or None
        "output_store": object_store.assignment_output(job),
        "ports": job.ports,
        "network_policy": job.network_policy,
        "pool_network": network,
        "max_runtime_s": job.max_runtime_s,
        "startup_timeout_s": knobs.startup_timeout_s,
        "stop_grace_s": knobs.stop_grace_s,
        "runtime": assignment_runtime(job, node, knobs),
        "limits": {
            "cpu_millicores": lease.cpu_millicores,
            "memory_mib": lease.memory_mib,
            # the lease's disk is scratch and /outputs together (leases.snapshot.core_request)
            "scratch_mib": max(0, lease.scratch_mib - job.output_limit_mib),
            "output_limit_mib": job.output_limit_mib,
            "pids": DEFAULT_PIDS,
            "cpuset": _cpuset(node, (lease.placement or {}).get("numa_node")),
            "gpus": _gpu_ids(lease, devices),
            "gpu_isolation": _lease_gpu_isolation(lease),
            # an MPS lease only: its caps per device (worker_agent/mps.py)
            **_mps_limits(lease, devices),
            # a MIG lease only: the profile leased at each slot, which the agent checks
            **_mig_profiles(lease, devices),
        },
        # its persistent volumes: [{"id", "size_mib", "path", "read_only"}] (worker_agent)
        "volumes": assignment_volumes(job.volumes),
        "checkpoint_requested": job.state == S.CHECKPOINTING,
        # the job's trace context: the agent sends it back on the job's reports and uploads
        "traceparent": job_traceparent(job),
    }


def _cpuset(node, numa_node) -> str | None:
    """The CPUs of the NUMA node the lease is pinned to, as Docker's cpuset ("0,1,2")."""
    if numa_node is None:
        return None
    for entry in node.numa_layout or ():
        cpus = entry.get("cpus") if isinstance(entry, dict) else None
        if entry.get("id") == numa_node and isinstance(cpus, list) and cpus:
            return ",".join(str(int(c)) for c in cpus)
    return None  # the layout does not list the CPUs: no pin rather than a wrong one


def _gpu_ids(lease, devices) -> list[str]:
    """The exact devices of the lease: a GPU's UUID, or for a MIG slice
    `MIG-<GPU UUID>/<first slot>/0` (GPU instance at that slot, compute instance 0), which the
    agent maps to the MIG device it finds there."""
    ids = []
    for alloc in lease.gpu_allocations:
        device = devices.get(alloc.get("gpu"))
        if device is None:
            continue
        mask = int(alloc.get("mig_slots") or 0)
        if mask:
            start = (mask & -mask).bit_length() - 1
            ids.append(f"MIG-{device.uuid}/{start}/0")
        else:
            ids.append(device.uuid)
    return ids


def _mps_limits(lease, devices) -> dict:
    """{"mps": [...]} for a lease of MPS shares, {} for any other."""
    shares = _mps_shares(lease, devices)
    return {"mps": shares} if shares else {}


def _mps_shares(lease, devices) -> list[dict]:
    """Per device of an MPS share: its UUID, `thread_percentage` (its compute) and
    `memory_mib` (its memory), from what the ledger reserved (the allocation's milli) by the
    one rule placement uses (placement.devices.mps_memory_mib). Only for a lease whose request
    is an MPS share on MPS devices; [] otherwise."""
    request = lease.request or {}
    if request.get("gpu_sharing_class") != GpuSharingClass.MPS:
        return []
    shares = []
    for alloc in lease.gpu_allocations or ():
        device = devices.get(alloc.get("gpu"))
        milli = int(alloc.get("milli") or 1000)
        if device is None or milli >= 1000 or alloc.get("mig_slots"):
            continue
        if device.sharing_mode != GpuSharingClass.MPS:
            continue
        shares.append(
            {
                "gpu": device.uuid,
                "milli": milli,
                "thread_percentage": mps_thread_percentage(milli),
                "memory_mib": mps_memory_mib(device.memory_mib, milli),
            }
        )
    return shares


def _mig_profiles(lease, devices) -> dict:
    """{"mig_profiles": {`MIG-<GPU UUID>/<first slot>/0`: the leased profile}} of the lease's
    MIG slices ({} without any): the worker agent refuses the attempt, `mig_profile_mismatch`,
    when the instance at that slot has another profile."""
    out = {}
    for alloc in lease.gpu_allocations:
        device = devices.get(alloc.get("gpu"))
        mask = int(alloc.get("mig_slots") or 0)
        if device is not None and mask and alloc.get("mig_profile"):
            start = (mask & -mask).bit_length() - 1
            out[f"MIG-{device.uuid}/{start}/0"] = str(alloc["mig_profile"])
    return {"mig_profiles": out} if out else {}


def gpu_isolation(resources: dict) -> str:
    """What a request's GPUs get: whole devices, MIG instances, or time-slice/MPS shares that
    are not isolated (a share of a whole device, gpu_milli 1000 or none, holds it alone)."""
    resources = resources or {}
    sharing = resources.get("gpu_sharing_class") or GpuSharingClass.NONE
    if sharing == GpuSharingClass.MIG:
        return GPU_MIG
    if sharing == GpuSharingClass.NONE or not int(resources.get("gpu_count") or 0):
        return GPU_NONE
    milli = int(resources.get("gpu_milli") or 1000)
    if sharing in (GpuSharingClass.TIMESLICE, GpuSharingClass.MPS) and milli < 1000:
        return GPU_SHARED
    return GPU_EXCLUSIVE


def _lease_gpu_isolation(lease) -> str:
    """The same label, from what the lease actually holds."""
    allocations = [a for a in lease.gpu_allocations or () if a.get("gpu")]
    if not allocations:
        return GPU_NONE
    if any(a.get("mig_slots") for a in allocations):
        return GPU_MIG
    if any(int(a.get("milli") or 1000) < 1000 for a in allocations):
        return GPU_SHARED
    return GPU_EXCLUSIVE
