"""What a node's heartbeat means for the leases of the jobs it runs: each is renewed, and the
usage the agent measured is recorded (latest, peak, running average). A route is stored once
the job's container answers.

Renewal by heartbeat writes no event: a job running for a day on a 10 s heartbeat would write
8,640 `renewed` events, burying its history, and each would publish live. Instead one guarded
UPDATE per heartbeat moves `expires_at` forward for the leases that qualify (committed, on this
node, their job past placement and not ended, no window; a backfill up to its reservation's
window start) and never backward;
a lease that no longer qualifies (its job ended, it went uncertain) is simply left out, so a
racing release or sweep cannot be undone by a heartbeat.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from leases.choices import LeaseState
from leases.models import Lease
from nodes.models import GpuDevice

# Jobs' states in which a heartbeat renews the job's lease: from startup (the lease is committed
# then, and pulling a large image may outlast the reservation's TTL) until the job ends. Named
# here as strings: the ledger sits below jobs and imports nothing of it (docs/architecture.md).
RENEWING_JOB_STATES = ("starting", "running", "checkpointing")
MEASURES = ("cpu_millicores", "memory_mib", "gpu_milli", "gpu_memory_mib")
# Bytes the job's container sent (a counter since it started, so its latest value is its
# total): kept in usage_peak only, for the egress quota (leases.services.quota).
EGRESS = "net_tx_bytes"


def heartbeat_leases(node, workloads: list[dict]):
    """The committed leases of this node that the workloads name (by lease or by job)."""
    lease_ids = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    job_ids = {int(w["job"]) for w in workloads if w.get("job") is not None}
    if not lease_ids and not job_ids:
        return Lease.objects.none()
    return Lease.objects.filter(node=node, state=LeaseState.COMMITTED).filter(
        Q(pk__in=lease_ids) | Q(job_id__in=job_ids)
    )


def leases_renew_by_heartbeat(*, node, workloads: list[dict], now=None) -> int:
    """Renew the reported leases of running jobs to now + LEASE_DEFAULT_TTL, a backfill's no
    later than its reservation's window start (it then makes way); returns how many. One
    guarded UPDATE per cap, no event (see the module's docstring)."""
    now = now or timezone.now()
    expires_at = now + settings.LEASE_DEFAULT_TTL
    running = heartbeat_leases(node, workloads).filter(
        job__state__in=RENEWING_JOB_STATES, window_start__isnull=True
    )
    renewed = running.filter(backfill_of__isnull=True, expires_at__lt=expires_at).update(
        expires_at=expires_at
    )
    backfills = running.filter(backfill_of__isnull=False).values_list(
        "backfill_of__window_start", flat=True
    )
    for window_start in set(backfills):
        cap = min(expires_at, window_start)
        renewed += running.filter(
            backfill_of__window_start=window_start, expires_at__lt=cap
        ).update(expires_at=cap)
    return renewed


def _sample(lease: Lease, usage: dict) -> dict:
    """The agent's usage (`gpu_utilization_percent` is the mean over the lease's devices) in
    the lease's measures."""
    devices = len(lease.gpu_allocations)
    return {
        "cpu_millicores": int(usage.get("cpu_millicores") or 0),
        "memory_mib": int(usage.get("memory_mib") or 0),
        "gpu_milli": round(float(usage.get("gpu_utilization_percent") or 0) * 10 * devices),
        "gpu_memory_mib": int(usage.get("gpu_memory_mib") or 0),
        EGRESS: int(usage.get(EGRESS) or 0),
    }


def _limits(lease: Lease) -> dict[str, tuple[int, str]]:
    """What each measure can truly reach, as lease_report_usage bounds it: CPU up to the node's
    raw CPU (a request is a share, not a cap), memory up to the lease's (the container's hard
    limit), GPU up to its devices (whole devices, their memory)."""
    gpu_ids = [a["gpu"] for a in lease.gpu_allocations if a.get("gpu") is not None]
    gpu_memory = 0
    if gpu_ids:
        gpu_memory = GpuDevice.objects.filter(pk__in=gpu_ids).aggregate(m=Sum("memory_mib"))["m"]
    return {
        "cpu_millicores": (lease.node.cpu_millicores_raw, "the node's CPU"),
        "memory_mib": (lease.memory_mib, "the lease's memory"),
        "gpu_milli": (1000 * len(lease.gpu_allocations), "the lease's GPUs"),
        "gpu_memory_mib": (gpu_memory or 0, "the lease's GPUs' memory"),
    }


def usage_problems(lease: Lease, usage: dict) -> dict[str, str]:
    sample = _sample(lease, usage)
    problems = {
        name: f"Must be between 0 and {limit} ({what})."
        for name, (limit, what) in _limits(lease).items()
        if not 0 <= sample[name] <= limit
    }
    if sample[EGRESS] < 0:
        problems[EGRESS] = "Must be at least 0."
    return problems


def leases_record_usage(*, node, workloads: list[dict], now=None) -> list[int]:
    """Record each reported workload's usage on its committed lease: latest, peak and running
    average. All are checked first (ValidationError with field errors per workload: nothing is
    written when one is out of bounds). Returns the leases written."""
    now = now or timezone.now()
    reported = [w for w in workloads if w.get("usage")]
    if not reported:
        return []
    leases = heartbeat_leases(node, reported).select_related("node")
    by_lease = {lease.pk: lease for lease in leases}
    by_job = {lease.job_id: lease for lease in by_lease.values() if lease.job_id}
    samples, errors = {}, {}
    for i, workload in enumerate(workloads):
        if not workload.get("usage"):
            continue
        lease = by_lease.get(workload.get("lease")) or by_job.get(workload.get("job"))
        if lease is None:
            continue  # not committed (any more): its usage no longer counts
        if problems := usage_problems(lease, workload["usage"]):
            errors[f"workloads[{i}].usage"] = [f"{k}: {v}" for k, v in problems.items()]
        samples[lease.pk] = _sample(lease, workload["usage"])
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        locked = Lease.objects.select_for_update().filter(
            pk__in=samples, state=LeaseState.COMMITTED
        )
        for lease in locked.order_by("pk"):
            _accumulate(lease, samples[lease.pk], now)
    return sorted(samples)


def _accumulate(lease: Lease, sample: dict, now) -> None:
    n = lease.usage_samples + 1
    peak, average = dict(lease.usage_peak or {}), dict(lease.usage_average or {})
    for name in MEASURES:
        value = sample[name]
        peak[name] = max(int(peak.get(name, 0)), value)
        previous = float(average.get(name, 0.0))
        average[name] = round(previous + (value - previous) / n, 2)
    peak[EGRESS] = max(int(peak.get(EGRESS, 0)), sample[EGRESS])  # a counter: never back
    lease.used_cpu_millicores = sample["cpu_millicores"]
    lease.used_memory_mib = sample["memory_mib"]
    lease.used_gpu_milli = sample["gpu_milli"]
    lease.usage_reported_at = now
    lease.usage_peak, lease.usage_average, lease.usage_samples = peak, average, n
    lease.save(
        update_fields=[
            "used_cpu_millicores",
            "used_memory_mib",
            "used_gpu_milli",
            "usage_reported_at",
            "usage_peak",
            "usage_average",
            "usage_samples",
        ]
    )


def lease_set_route(*, lease: Lease, route: dict) -> int:
    """Where the lease's running workload answers (no state change, no event: the job's
    `container_started` event carries it)."""
    return Lease.objects.filter(pk=lease.pk, state=LeaseState.COMMITTED).update(route=route)
