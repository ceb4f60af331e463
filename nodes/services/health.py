"""Device health from heartbeats: an unsuitable GPU leaves scheduling alone (the node stays)
and gets a recovery probe; only a passing probe brings it back (nodes/services/probes.py)."""

from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.reasons import Reason

from ..choices import GpuHealth, ProbeKind
from ..health_rules import gpu_health_evaluate, gpu_health_findings
from ..models import GpuDevice, Node
from .base import node_event
from .probes import probe_request


def gpu_mark_unsuitable(
    *,
    gpu: GpuDevice,
    health: str,
    flags: list[str],
    reason_text: str,
    actor: Actor,
    now=None,
    rules: list[str] | None = None,
    data: dict | None = None,
) -> bool:
    """Take one device out of scheduling and ask for a recovery probe. False if already out."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = GpuDevice.objects.filter(pk=gpu.pk, healthy=True).update(
            healthy=False,
            health=health,
            health_flags=flags,
            health_reason=reason_text[:200],
            health_changed_at=now,
        )
        if not changed:
            return False
        node = Node.objects.get(pk=gpu.node_id)
        node_event(
            node,
            actor=actor,
            reason=Reason.GPU_UNSUITABLE,
            message=f"gpu {gpu.index} ({gpu.uuid}) unschedulable: {reason_text}",
            now=now,
            data={
                "gpu": gpu.uuid,
                "health": health,
                "flags": flags,
                # the reason codes of the health rules broken (nodes.health_rules)
                "rules": list(rules or ()),
                **(data or {}),
            },
        )
        if health != GpuHealth.MISSING:
            probe_request(
                node=node, kind=ProbeKind.RECOVERY, gpu=gpu, actor=Actor.system("health"), now=now
            )
    return True


def gpu_health_apply(*, node: Node, reports: list[dict], actor: Actor, now=None) -> list[str]:
    """Mark reported devices that became unsuitable; returns their uuids.

    A device that reports healthy again stays out until its recovery probe passes.
    """
    now = now or timezone.now()
    by_uuid = {g.uuid: g for g in node.gpus.all()}
    marked = []
    for report in reports:
        gpu = by_uuid.get(report.get("uuid"))
        if gpu is None:
            continue
        if report.get("temperature_c") is not None:
            GpuDevice.objects.filter(pk=gpu.pk).update(temperature_c=report["temperature_c"])
        report = {**report, "_at": now.timestamp()}
        previous = nvlink_counters_swap(gpu, report)
        findings = gpu_health_findings(report, previous)
        if not findings:
            continue
        health, flags, why = gpu_health_evaluate(report, previous)
        extra = {}
        for finding in findings:
            extra |= finding.data or {}
        if gpu_mark_unsuitable(
            gpu=gpu,
            health=health,
            flags=flags,
            reason_text=why,
            actor=actor,
            now=now,
            rules=[str(f.code) for f in findings],
            data=extra,
        ):
            marked.append(gpu.uuid)
    return marked


def nvlink_counters_swap(gpu: GpuDevice, report: dict) -> dict | None:
    """The device's NVLink counters at its previous reading ({"at", "counters"}, the column
    `GpuDevice.nvlink_counters`; None before the first), replaced by this one's: the counters
    are cumulative, so a rule compares the two readings."""
    previous = gpu.nvlink_counters or None
    if report.get("nvlink_errors"):
        GpuDevice.objects.filter(pk=gpu.pk).update(
            nvlink_counters={"at": report["_at"], "counters": dict(report["nvlink_errors"])}
        )
    return previous
