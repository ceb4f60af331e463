"""Node lifecycle, enrollment, credentials, probes, heartbeats, inventory and drain.

Every write to a node goes through here. A lifecycle change goes through `node_transition`
(the one transition helper); a change of a condition (reachability), of a device's health, of
capacity or of credentials writes a NodeEvent too, with from_state == to_state == the node's
state, so the node's event list is the whole story of why it is where it is.

Sweeps take `now` and use guarded updates: "0 rows updated" means another worker did it. Each
node of a sweep is handled in its own transaction (`_each_node`): one bad row never stops the
others.
"""

from __future__ import annotations

import copy
import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

# The lease ledger owns capacity columns; nodes hand their leases to it (never the reverse).
from leases import services as lease_services
from pools.actors import Actor
from pools.choices import TrustLevel
from pools.models import ComputePool, new_token_secret, token_digest
from pools.reasons import Reason
from pools.statemachine import TransitionRefused, record_sweep_failure, transition
from worker_agent.schema import GPU_KEYS, GPU_SCHEMA

from .choices import (
    NODE_TRANSITIONS,
    DrainPolicy,
    GpuHealth,
    NodeState,
    ProbeKind,
    ProbeState,
    Reachability,
)
from .models import EnrollmentToken, GpuDevice, Node, NodeCredential, NodeEvent, NodeProbe

ENROLLMENT_PREFIX = "cpe_"
CREDENTIAL_PREFIX = "cpn_"

# Defaults; each may be overridden in settings (read at call time, never at import).
DEFAULTS = {
    "NODE_CREDENTIAL_TTL": timedelta(days=30),
    "NODE_CREDENTIAL_OVERLAP": timedelta(minutes=10),
    "NODE_MISSED_HEARTBEATS": 3,  # unreachable after this many intervals of silence
    "NODE_GPU_MAX_TEMPERATURE_C": 90,  # when NVML gives no slowdown threshold
    "NODE_DRIFT_LARGE_PERCENT": 10,  # CPU or memory shrinking more than this quarantines
    "NODE_PROBE_MEMORY_TOLERANCE_PERCENT": 5,  # a container sees a little less than the host
}


def setting(name: str):
    return getattr(settings, name, DEFAULTS[name])


class NodeScopeRefused(Exception):
    """A node credential tried to act outside its own node (another node's lease, job, probe)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = "outside_node_scope"
        self.message = message


class EnrollmentRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.code = "enrollment_refused"
        self.message = message


# --------------------------------------------------------------------------- capacity


def allocatable_from_raw(
    pool: ComputePool, *, cpu_millicores: int, memory_mib: int, scratch_mib: int
) -> dict[str, int]:
    """allocatable = raw − system reserve − safety margin (a share of what is left)."""
    keep = (100 - pool.safety_margin_percent) / 100

    def usable(raw: int, reserve: int) -> int:
        return max(0, int((raw - reserve) * keep))

    return {
        "cpu_millicores_allocatable": usable(cpu_millicores, pool.system_reserve_cpu_millicores),
        "memory_mib_allocatable": usable(memory_mib, pool.system_reserve_memory_mib),
        "scratch_mib_allocatable": usable(scratch_mib, 0),
    }


# The inventory format is the agent's schema (worker_agent/schemas/inventory-v1.json); a GPU's
# fields there are GpuDevice columns, and its defaults are the schema's.
GPU_FIELDS = tuple(key for key in GPU_KEYS if key != "index")
GPU_DEFAULTS = {
    key: spec["default"] for key, spec in GPU_SCHEMA["properties"].items() if "default" in spec
}


def normalize_inventory(inventory: dict) -> dict:
    """The registered form of an inventory: the schema's fields and defaults, in a stable order."""
    gpus = []
    for i, gpu in enumerate(inventory.get("gpus") or []):
        item = {field: gpu.get(field) for field in GPU_FIELDS if gpu.get(field) is not None}
        item = copy.deepcopy(GPU_DEFAULTS) | item
        item["index"] = gpu.get("index", i)
        gpus.append(item)
    return {
        "cpu_millicores": int(inventory.get("cpu_millicores") or 0),
        "memory_mib": int(inventory.get("memory_mib") or 0),
        "scratch_mib": int(inventory.get("scratch_mib") or 0),
        "numa": list(inventory.get("numa") or []),
        "gpus": sorted(gpus, key=lambda g: g["index"]),
    }


def _gpu_model_fields(gpu: dict) -> dict:
    fields = {field: gpu[field] for field in GPU_FIELDS if field in gpu}
    fields.setdefault("model", "")
    fields.setdefault("memory_mib", 0)
    fields["index"] = gpu["index"]
    return fields


# --------------------------------------------------------------------------- lifecycle


def _event(node: Node, *, actor: Actor, reason: str, message: str = "", now=None, data=None):
    """An event that does not change the lifecycle state (condition, device, capacity …)."""
    return NodeEvent.record(
        node,
        actor=actor,
        from_state=node.state,
        to_state=node.state,
        reason=reason,
        message=message,
        at=now,
        data=data,
    )


@transaction.atomic
def node_register(
    *,
    pool: ComputePool,
    name: str,
    actor: Actor,
    cpu_millicores: int,
    memory_mib: int,
    scratch_mib: int = 0,
    gpus: list[dict] | None = None,
    reason: str = Reason.ENROLLED,
    now=None,
    **fields,
) -> Node:
    """Create a node in `registered` with its inventory; it is not schedulable yet."""
    now = now or timezone.now()
    gpus = [dict(g, index=g.get("index", i)) for i, g in enumerate(gpus or [])]
    fields.setdefault(
        "inventory",
        normalize_inventory(
            {
                "cpu_millicores": cpu_millicores,
                "memory_mib": memory_mib,
                "scratch_mib": scratch_mib,
                "numa": fields.get("numa_layout") or [],
                "gpus": gpus,
            }
        ),
    )
    node = Node.objects.create(
        pool=pool,
        name=name,
        cpu_millicores_raw=cpu_millicores,
        memory_mib_raw=memory_mib,
        scratch_mib_raw=scratch_mib,
        state_changed_at=now,
        reachability_changed_at=now,
        created_at=now,
        **allocatable_from_raw(
            pool, cpu_millicores=cpu_millicores, memory_mib=memory_mib, scratch_mib=scratch_mib
        ),
        **fields,
    )
    GpuDevice.objects.bulk_create(GpuDevice(node=node, **_gpu_model_fields(g)) for g in gpus)
    NodeEvent.record(
        node,
        actor=actor,
        from_state="",
        to_state=node.state,
        reason=reason,
        message=f"registered in pool {pool.slug}",
        at=now,
    )
    return node


def node_transition(
    *,
    node: Node,
    to: str,
    actor: Actor,
    reason: str,
    message: str = "",
    now=None,
    data: dict | None = None,
    changes: dict | None = None,
    check=None,
) -> Node:
    return transition(
        Node,
        node.pk,
        to=to,
        allowed=NODE_TRANSITIONS,
        event_model=NodeEvent,
        actor=actor,
        reason=reason,
        message=message,
        now=now or timezone.now(),
        data=data,
        changes=changes,
        check=check,
    )


def _must_be(state: str, code: str):
    """A precondition checked under the row lock: the node must be in `state`."""

    def check(obj):
        if obj.state != state:
            raise TransitionRefused(code, f"node {obj} is not {state}")

    return check


def node_verify(
    *,
    node: Node,
    actor: Actor,
    reason: str = Reason.AGENT_AUTHENTICATED,
    message: str = "",
    now=None,
    data: dict | None = None,
) -> Node:
    return node_transition(
        node=node,
        to=NodeState.VERIFIED,
        actor=actor,
        reason=reason,
        message=message,
        now=now,
        data=data,
    )


def node_mark_ready(
    *,
    node: Node,
    actor: Actor,
    reason: str = Reason.OPERATOR_ACTION,
    message: str = "",
    now=None,
) -> Node:
    return node_transition(
        node=node, to=NodeState.READY, actor=actor, reason=reason, message=message, now=now
    )


def node_drain(*, node: Node, actor: Actor, deadline=None, message: str = "", now=None) -> Node:
    """No new placements from now; running work continues until it ends or `deadline`."""
    now = now or timezone.now()
    if deadline is not None and deadline <= now:
        raise TransitionRefused("deadline_in_past", "A drain deadline must be in the future.")
    text = message or (f"drain until {deadline:%Y-%m-%d %H:%M:%S %Z}" if deadline else "drain")
    return node_transition(
        node=node,
        to=NodeState.DRAINING,
        actor=actor,
        reason=Reason.DRAIN_REQUESTED,
        message=text,
        now=now,
        data={"deadline": deadline.isoformat() if deadline else None},
        changes={"drain_deadline": deadline, "drain_enforced_at": None, "drained_at": None},
    )


def node_drain_cancel(*, node: Node, actor: Actor, message: str = "", now=None) -> Node:
    return node_transition(
        node=node,
        to=NodeState.READY,
        actor=actor,
        reason=Reason.DRAIN_CANCELLED,
        message=message or "drain cancelled",
        now=now,
        check=_must_be(NodeState.DRAINING, "not_draining"),
        changes={"drain_deadline": None, "drain_enforced_at": None, "drained_at": None},
    )


def node_quarantine(
    *,
    node: Node,
    actor: Actor,
    message: str,
    reason: str = Reason.QUARANTINED,
    data: dict | None = None,
    now=None,
) -> Node:
    return node_transition(
        node=node,
        to=NodeState.QUARANTINED,
        actor=actor,
        reason=reason,
        message=message,
        data=data,
        now=now,
    )


def node_release(*, node: Node, actor: Actor, message: str = "", now=None) -> Node:
    """Release from quarantine back to ready (only from quarantined)."""
    return node_transition(
        node=node,
        to=NodeState.READY,
        actor=actor,
        reason=Reason.QUARANTINE_RELEASED,
        message=message or "released from quarantine",
        now=now,
        check=_must_be(NodeState.QUARANTINED, "not_quarantined"),
    )


def node_retire(*, node: Node, actor: Actor, message: str = "", now=None) -> Node:
    """Terminal. Its credentials are revoked in the same transaction."""
    now = now or timezone.now()
    with transaction.atomic():
        node = node_transition(
            node=node,
            to=NodeState.RETIRED,
            actor=actor,
            reason=Reason.RETIRED,
            message=message or "retired",
            now=now,
        )
        NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    return node


# --------------------------------------------------------------------------- enrollment


def enrollment_token_issue(
    *,
    pool: ComputePool,
    actor: Actor,
    max_uses: int = 1,
    ttl: timedelta = timedelta(hours=24),
    name: str = "",
    now=None,
) -> tuple[EnrollmentToken, str]:
    """A new enrollment token; the secret is returned here once and never stored."""
    now = now or timezone.now()
    secret = new_token_secret("e")
    token = EnrollmentToken.objects.create(
        pool=pool,
        name=name,
        digest=token_digest(secret),
        prefix=secret[:12],
        max_uses=max_uses,
        expires_at=now + ttl,
        created_by=actor.user,
        created_at=now,
    )
    return token, secret


def enrollment_token_revoke(*, token: EnrollmentToken, now=None) -> EnrollmentToken:
    now = now or timezone.now()
    EnrollmentToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    token.refresh_from_db()
    return token


def identity_fingerprint(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest() if identity else ""


def node_enroll(
    *,
    secret: str,
    name: str,
    inventory: dict,
    identity: str = "",
    now=None,
    **fields,
) -> tuple[Node, str, NodeProbe | None]:
    """A token holder joins the token's pool: node `registered`, its credential, maybe a probe.

    Returns (node, credential secret shown once, validation probe for marketplace pools).
    """
    now = now or timezone.now()
    with transaction.atomic():
        token = (
            EnrollmentToken.objects.select_for_update()
            .select_related("pool")
            .filter(digest=token_digest(secret or ""))
            .first()
        )
        if token is None:
            raise EnrollmentRefused("Unknown enrollment token.")
        refusal = token.refusal(now)
        if refusal:
            raise EnrollmentRefused(f"Enrollment token {token.prefix}… is {refusal}.")
        token.uses += 1
        token.save(update_fields=["uses"])
        pool = token.pool
        claims = normalize_inventory(inventory)
        node = node_register(
            pool=pool,
            name=name,
            actor=Actor(kind="node", label=f"node:{name}"),
            cpu_millicores=claims["cpu_millicores"],
            memory_mib=claims["memory_mib"],
            scratch_mib=claims["scratch_mib"],
            gpus=claims["gpus"],
            now=now,
            inventory=claims,
            numa_layout=claims["numa"],
            identity_fingerprint=identity_fingerprint(identity),
            enrollment_token=token,
            **fields,
        )
        _, credential_secret = node_credential_issue(node=node, now=now)
        probe = None
        if pool.trust_level == TrustLevel.MARKETPLACE:
            probe = probe_request(
                node=node,
                kind=ProbeKind.VALIDATION,
                actor=Actor.system("verification"),
                now=now,
            )
    return node, credential_secret, probe


# --------------------------------------------------------------------------- credentials


def node_credential_issue(*, node: Node, now=None, ttl=None) -> tuple[NodeCredential, str]:
    now = now or timezone.now()
    secret = new_token_secret("n")
    credential = NodeCredential.objects.create(
        node=node,
        digest=token_digest(secret),
        prefix=secret[:12],
        created_at=now,
        expires_at=now + (ttl or setting("NODE_CREDENTIAL_TTL")),
    )
    return credential, secret


def node_credential_rotate(
    *, credential: NodeCredential, actor: Actor, now=None
) -> tuple[NodeCredential, str]:
    """The agent replaces its credential before expiry; the old one stays valid a short overlap.

    A credential that was already rotated cannot be rotated again (a leaked old secret must not
    be able to mint new ones).
    """
    now = now or timezone.now()
    with transaction.atomic():
        old = (
            NodeCredential.objects.select_for_update().select_related("node").get(pk=credential.pk)
        )
        refusal = old.refusal(now)
        if refusal:
            raise TransitionRefused("credential_invalid", f"This credential is {refusal}.")
        if old.replaced_by_id is not None:
            raise TransitionRefused(
                "credential_already_rotated", "Already rotated; use the new one."
            )
        new, secret = node_credential_issue(node=old.node, now=now)
        old.valid_until = min(old.expires_at, now + setting("NODE_CREDENTIAL_OVERLAP"))
        old.replaced_by = new
        old.save(update_fields=["valid_until", "replaced_by"])
        _event(
            old.node,
            actor=actor,
            reason=Reason.CREDENTIAL_ROTATED,
            message=f"credential {old.prefix}… replaced by {new.prefix}…, "
            f"old valid until {old.valid_until:%H:%M:%S}",
            now=now,
            data={
                "old": old.prefix,
                "new": new.prefix,
                "old_valid_until": old.valid_until.isoformat(),
            },
        )
    return new, secret


def node_credential_reissue(*, node: Node, actor: Actor, now=None) -> tuple[NodeCredential, str]:
    """Operator rotation: a new credential, shown once; current ones keep a short overlap."""
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.state == NodeState.RETIRED:
            raise TransitionRefused("node_retired", f"node {node} is retired")
        new, secret = node_credential_issue(node=node, now=now)
        overlap_end = now + setting("NODE_CREDENTIAL_OVERLAP")
        NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exclude(pk=new.pk).filter(
            Q(valid_until__isnull=True) | Q(valid_until__gt=overlap_end)
        ).update(valid_until=overlap_end)
        _event(
            node,
            actor=actor,
            reason=Reason.CREDENTIAL_ROTATED,
            message=f"new credential {new.prefix}… issued by an operator",
            now=now,
            data={"new": new.prefix},
        )
    return new, secret


def node_credentials_revoke(*, node: Node, actor: Actor, message: str = "", now=None) -> int:
    """Revoke every credential of the node at once; returns how many were still unrevoked."""
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        count = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(
            revoked_at=now
        )
        _event(
            node,
            actor=actor,
            reason=Reason.CREDENTIAL_REVOKED,
            message=message or f"{count} credential(s) revoked",
            now=now,
            data={"revoked": count},
        )
    return count


def credential_for_secret(secret: str, *, now=None) -> tuple[NodeCredential | None, str]:
    """(credential, "") when valid for a non-retired node, else (None, why)."""
    now = now or timezone.now()
    credential = (
        NodeCredential.objects.select_related("node", "node__pool")
        .filter(digest=token_digest(secret))
        .first()
    )
    if credential is None:
        return None, "unknown credential"
    refusal = credential.refusal(now)
    if refusal:
        return None, f"credential {refusal}"
    if credential.node.state == NodeState.RETIRED:
        return None, "node retired"
    if credential.last_used_at is None or (now - credential.last_used_at).total_seconds() > 60:
        NodeCredential.objects.filter(pk=credential.pk).update(last_used_at=now)
    return credential, ""


# --------------------------------------------------------------------------- probes


def probe_request(
    *, node: Node, kind: str, actor: Actor, gpu: GpuDevice | None = None, now=None
) -> NodeProbe:
    now = now or timezone.now()
    with transaction.atomic():
        # one open probe of a kind per node (per device for recovery)
        open_probe = NodeProbe.objects.filter(
            node=node, kind=kind, gpu=gpu, state=ProbeState.REQUESTED
        ).first()
        if open_probe is not None:
            return open_probe
        expected = node.inventory if kind == ProbeKind.VALIDATION else {"uuid": gpu.uuid}
        probe = NodeProbe.objects.create(
            node=node, gpu=gpu, kind=kind, expected=expected, requested_at=now
        )
        what = f"device {gpu.uuid}" if gpu else "the node's claims"
        _event(
            node,
            actor=actor,
            reason=Reason.PROBE_REQUESTED,
            message=f"{kind} probe {probe.pk} requested for {what}",
            now=now,
            data={"probe": probe.pk, "kind": kind},
        )
    return probe


def compare_claims(expected: dict, measured: dict) -> list[str]:
    """What the probe measured against what the node claimed; each difference in words."""
    tolerance = setting("NODE_PROBE_MEMORY_TOLERANCE_PERCENT") / 100
    diffs = []
    claimed_cpu = int(expected.get("cpu_millicores") or 0)
    seen_cpu = int(measured.get("cpu_count") or 0) * 1000
    if "cpu_millicores" in measured:
        seen_cpu = int(measured["cpu_millicores"])
    if seen_cpu < claimed_cpu:
        diffs.append(f"cpu: claimed {claimed_cpu}m, measured {seen_cpu}m")
    claimed_mem = int(expected.get("memory_mib") or 0)
    seen_mem = int(measured.get("memory_mib") or 0)
    if seen_mem < claimed_mem * (1 - tolerance):
        diffs.append(f"memory: claimed {claimed_mem} MiB, measured {seen_mem} MiB")
    seen_gpus = {g.get("uuid"): g for g in measured.get("gpus") or []}
    for gpu in expected.get("gpus") or []:
        seen = seen_gpus.get(gpu.get("uuid"))
        label = f"gpu {gpu.get('index')} ({gpu.get('uuid')})"
        if seen is None:
            diffs.append(f"{label}: claimed {gpu.get('model')}, not seen")
            continue
        if (seen.get("model") or "") != (gpu.get("model") or ""):
            diffs.append(f"{label}: claimed model {gpu.get('model')}, measured {seen.get('model')}")
        claimed = int(gpu.get("memory_mib") or 0)
        got = int(seen.get("memory_mib") or 0)
        if got < claimed * (1 - tolerance):
            diffs.append(f"{label}: claimed {claimed} MiB, measured {got} MiB")
    benchmark = measured.get("benchmark")
    if not isinstance(benchmark, dict) or not benchmark:
        diffs.append("benchmark: no result")
    return diffs


def probe_result_submit(
    *, probe: NodeProbe, credential: NodeCredential, result: dict, now=None
) -> NodeProbe:
    """Accept a probe result only from the probed node's own credential, then act on it."""
    now = now or timezone.now()
    actor = Actor.for_node(credential.node)
    with transaction.atomic():
        probe = (
            NodeProbe.objects.select_for_update(of=("self",))
            .select_related("node", "gpu")
            .get(pk=probe.pk)
        )
        if probe.node_id != credential.node_id:
            raise NodeScopeRefused(f"probe {probe.pk} belongs to another node")
        if probe.state != ProbeState.REQUESTED:
            raise TransitionRefused("probe_closed", f"probe {probe.pk} is already {probe.state}")
        node = probe.node
        if probe.kind == ProbeKind.VALIDATION:
            diffs = compare_claims(probe.expected, result)
        else:
            health, _flags, why = gpu_health_evaluate(result)
            diffs = [] if result.get("passed") and health == GpuHealth.OK else [why or "failed"]
        probe.state = ProbeState.FAILED if diffs else ProbeState.PASSED
        probe.result = result
        probe.differences = diffs
        probe.completed_at = now
        probe.reported_by = credential
        probe.save(update_fields=["state", "result", "differences", "completed_at", "reported_by"])
        data = {"probe": probe.pk, "differences": diffs}
        if probe.kind == ProbeKind.VALIDATION:
            if diffs:
                node_quarantine(
                    node=node,
                    actor=actor,
                    reason=Reason.PROBE_MISMATCH,
                    message="probe contradicted the claims: " + "; ".join(diffs),
                    data=data,
                    now=now,
                )
            else:
                node = node_verify(
                    node=node,
                    actor=actor,
                    reason=Reason.PROBE_PASSED,
                    message=f"probe {probe.pk} matched the claims",
                    now=now,
                    data=data,
                )
                node_mark_ready(
                    node=node,
                    actor=Actor.system("verification"),
                    reason=Reason.PROBE_PASSED,
                    message="verified by probe",
                    now=now,
                )
        elif diffs:
            _event(
                node,
                actor=actor,
                reason=Reason.PROBE_FAILED,
                message=f"recovery probe of {probe.gpu.uuid} failed: {diffs[0]}",
                now=now,
                data=data,
            )
        else:
            gpu_recover(gpu=probe.gpu, actor=actor, probe=probe, now=now)
    return probe


# --------------------------------------------------------------------------- device health


def gpu_health_evaluate(report: dict) -> tuple[str, list[str], str]:
    """(health, flags, reason) for one device's health report (NVML readings)."""
    flags, why = [], []
    if report.get("xid_errors") or report.get("ecc_errors_uncorrected") or report.get("error"):
        flags.append("xid_error")
        why.append(report.get("error") or "device error (XID/ECC)")
    if report.get("health_check") == "failed":
        flags.append("health_check_failed")
        why.append("health check failed")
    temperature = report.get("temperature_c")
    limit = report.get("slowdown_temperature_c") or setting("NODE_GPU_MAX_TEMPERATURE_C")
    if temperature is not None and temperature >= limit:
        flags.append("over_temperature")
        why.append(f"{temperature}°C ≥ {limit}°C")
    width, width_max = report.get("pcie_link_width"), report.get("pcie_link_width_max")
    if (width and width_max and width < width_max) or report.get("nvlink_down"):
        flags.append("pcie_degraded")
        why.append(f"link x{width} of x{width_max}" if width else "NVLink down")
    order = [
        ("xid_error", GpuHealth.ERROR),
        ("health_check_failed", GpuHealth.HEALTH_CHECK_FAILED),
        ("over_temperature", GpuHealth.TOO_HOT),
        ("pcie_degraded", GpuHealth.DEGRADED_LINK),
    ]
    health = next((h for flag, h in order if flag in flags), GpuHealth.OK)
    return health, flags, "; ".join(why)


def gpu_mark_unsuitable(
    *, gpu: GpuDevice, health: str, flags: list[str], reason_text: str, actor: Actor, now=None
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
        _event(
            node,
            actor=actor,
            reason=Reason.GPU_UNSUITABLE,
            message=f"gpu {gpu.index} ({gpu.uuid}) unschedulable: {reason_text}",
            now=now,
            data={"gpu": gpu.uuid, "health": health, "flags": flags},
        )
        if health != GpuHealth.MISSING:
            probe_request(
                node=node, kind=ProbeKind.RECOVERY, gpu=gpu, actor=Actor.system("health"), now=now
            )
    return True


def gpu_recover(*, gpu: GpuDevice, actor: Actor, probe: NodeProbe, now=None) -> bool:
    now = now or timezone.now()
    changed = GpuDevice.objects.filter(pk=gpu.pk, healthy=False).update(
        healthy=True, health=GpuHealth.OK, health_flags=[], health_reason="", health_changed_at=now
    )
    if changed:
        _event(
            Node.objects.get(pk=gpu.node_id),
            actor=actor,
            reason=Reason.GPU_RECOVERED,
            message=f"gpu {gpu.index} ({gpu.uuid}) schedulable again: recovery probe passed",
            now=now,
            data={"gpu": gpu.uuid, "probe": probe.pk},
        )
    return bool(changed)


# --------------------------------------------------------------------------- heartbeats


def _node_leases(node: Node):
    from leases.models import Lease

    return Lease.objects.filter(node=node)


def check_workloads_scope(node: Node, workloads: list[dict]) -> None:
    """Every lease and job a node reports must be placed on that node."""
    from jobs.models import Job

    lease_ids = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    job_ids = {int(w["job"]) for w in workloads if w.get("job") is not None}
    own_leases = set(_node_leases(node).filter(pk__in=lease_ids).values_list("pk", flat=True))
    if lease_ids - own_leases:
        raise NodeScopeRefused(f"leases {sorted(lease_ids - own_leases)} are not on this node")
    own_jobs = set(
        Job.objects.filter(pk__in=job_ids, leases__node=node).values_list("pk", flat=True)
    )
    if job_ids - own_jobs:
        raise NodeScopeRefused(f"jobs {sorted(job_ids - own_jobs)} are not placed on this node")


def node_heartbeat(
    *,
    node: Node,
    actor: Actor,
    now=None,
    usage: dict | None = None,
    gpus: list[dict] | None = None,
    workloads: list[dict] | None = None,
    agent_version: str = "",
) -> Node:
    """Liveness, usage and device health from the node's agent.

    A private-fleet node that is still `registered` is verified and made ready by its first
    authenticated heartbeat; a node that was unreachable becomes reachable and the workloads it
    reports are reconciled with its uncertain leases.
    """
    now = now or timezone.now()
    workloads = workloads or []
    check_workloads_scope(node, workloads)
    fields = {"last_heartbeat_at": now, "usage": usage or {}}
    if agent_version:
        fields["agent_version"] = agent_version
    Node.objects.filter(pk=node.pk).update(**fields)
    node.refresh_from_db()
    returned = Node.objects.filter(pk=node.pk, reachability=Reachability.UNREACHABLE).update(
        reachability=Reachability.REACHABLE, reachability_changed_at=now
    )
    if returned:
        node.refresh_from_db()
        _event(
            node,
            actor=actor,
            reason=Reason.NODE_RETURNED,
            message=f"heartbeat resumed; {len(workloads)} workload(s) reported",
            now=now,
        )
        node_workloads_reconcile(node=node, workloads=workloads, actor=actor, now=now)
    if node.state == NodeState.REGISTERED and node.pool.trust_level == TrustLevel.PRIVATE:
        try:
            node = node_verify(
                node=node, actor=actor, message="private fleet: authenticated agent", now=now
            )
            node = node_mark_ready(
                node=node, actor=actor, reason=Reason.AGENT_AUTHENTICATED, now=now
            )
        except TransitionRefused:
            node.refresh_from_db()  # another heartbeat got there first
    gpu_health_apply(node=node, reports=gpus or [], actor=actor, now=now)
    return node


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
        health, flags, why = gpu_health_evaluate(report)
        if health != GpuHealth.OK and gpu_mark_unsuitable(
            gpu=gpu, health=health, flags=flags, reason_text=why, actor=actor, now=now
        ):
            marked.append(gpu.uuid)
    return marked


def node_mark_unreachable(*, node: Node, cutoff, actor: Actor, now=None) -> bool:
    """Guarded: only if still reachable and still silent since `cutoff`."""
    from leases.choices import LeaseState

    now = now or timezone.now()
    with transaction.atomic():
        changed = (
            Node.objects.filter(pk=node.pk, reachability=Reachability.REACHABLE)
            .filter(
                Q(last_heartbeat_at__lt=cutoff)
                | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff)
            )
            .update(reachability=Reachability.UNREACHABLE, reachability_changed_at=now)
        )
        if not changed:
            return False
        node.refresh_from_db()
        leases = list(_node_leases(node).filter(state=LeaseState.COMMITTED))
        _event(
            node,
            actor=actor,
            reason=Reason.NODE_UNREACHABLE,
            message=f"no heartbeat since {node.last_heartbeat_at or node.created_at:%H:%M:%S}; "
            f"{len(leases)} committed lease(s) now uncertain",
            now=now,
            data={"leases": [lease.pk for lease in leases]},
        )
        for lease in leases:
            lease_services.lease_mark_uncertain(lease=lease, actor=actor, now=now)
    return True


def _each_node(nodes, step, *, actor: Actor, now) -> dict:
    """{node id: step(node)} for each node, each in its own transaction. A node whose step
    raises is rolled back, left out, and the error recorded on it (`sweep_failed`, once per
    distinct error) and logged; the sweep goes on with the next node."""
    results = {}
    for node in nodes:
        try:
            with transaction.atomic():
                results[node.pk] = step(node)
        except Exception as error:
            record_sweep_failure(
                Node, node.pk, event_model=NodeEvent, actor=actor, error=error, now=now
            )
    return results


def node_heartbeat_sweep(*, now=None) -> list[int]:
    """Mark silent nodes unreachable (per-pool interval × missed beats). Returns node ids."""
    now = now or timezone.now()
    actor = Actor.system("heartbeat-sweep")
    marked = []
    missed = setting("NODE_MISSED_HEARTBEATS")
    for pool in ComputePool.objects.all():
        cutoff = now - timedelta(seconds=pool.heartbeat_interval_s * missed)
        silent = (
            Node.objects.filter(pool=pool, reachability=Reachability.REACHABLE)
            .exclude(state=NodeState.RETIRED)
            .filter(
                Q(last_heartbeat_at__lt=cutoff)
                | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff)
            )
        )
        done = _each_node(
            silent,
            lambda node, cutoff=cutoff: node_mark_unreachable(
                node=node, cutoff=cutoff, actor=actor, now=now
            ),
            actor=actor,
            now=now,
        )
        marked += [pk for pk, changed in done.items() if changed]
    return marked


def node_workloads_reconcile(*, node: Node, workloads: list[dict], actor: Actor, now=None):
    """After a node returns: its uncertain leases it still runs are committed again; the
    others are released (the workload is gone). Returns {"running": [...], "gone": [...]}."""
    from leases.choices import LeaseState

    now = now or timezone.now()
    reported = {int(w["lease"]) for w in workloads if w.get("lease") is not None}
    running, gone = [], []
    for lease in _node_leases(node).filter(state=LeaseState.UNCERTAIN):
        still_runs = lease.pk in reported
        (running if still_runs else gone).append(lease.pk)
        lease_services.lease_reconcile(lease=lease, running=still_runs, actor=actor, now=now)
    return {"running": running, "gone": gone}


# --------------------------------------------------------------------------- inventory


def node_inventory_report(*, node: Node, inventory: dict, now=None) -> Node:
    """Store what the node reports now; the reconciliation sweep compares it with the claims."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).update(
        reported_inventory=normalize_inventory(inventory), inventory_reported_at=now
    )
    node.refresh_from_db()
    return node


def inventory_drift(registered: dict, reported: dict) -> tuple[list[dict], bool]:
    """(differences, large?) between the registered and the reported inventory."""
    large_percent = setting("NODE_DRIFT_LARGE_PERCENT")
    diffs, large = [], False
    for field in ("cpu_millicores", "memory_mib", "scratch_mib"):
        before, after = int(registered.get(field) or 0), int(reported.get(field) or 0)
        if before != after:
            percent = round(100 * (after - before) / before, 1) if before else 100.0
            diffs.append({"field": field, "from": before, "to": after, "percent": percent})
            if field != "scratch_mib" and percent < -large_percent:
                large = True
    old = {g["uuid"]: g for g in registered.get("gpus") or []}
    new = {g["uuid"]: g for g in reported.get("gpus") or []}
    for uuid, gpu in old.items():
        if uuid not in new:
            diffs.append(
                {"field": "gpu", "uuid": uuid, "change": "gone", "model": gpu.get("model")}
            )
            large = True
            continue
        for field in ("model", "memory_mib", "mig_enabled", "driver_version", "cuda_version"):
            if gpu.get(field) != new[uuid].get(field):
                diffs.append(
                    {
                        "field": f"gpu.{field}",
                        "uuid": uuid,
                        "from": gpu.get(field),
                        "to": new[uuid].get(field),
                    }
                )
                if field in ("model", "memory_mib"):
                    large = True
    for uuid in new.keys() - old.keys():
        diffs.append({"field": "gpu", "uuid": uuid, "change": "added", "model": new[uuid]["model"]})
    return diffs, large


def _describe(diff: dict) -> str:
    if diff.get("change"):
        return f"gpu {diff['uuid']} ({diff.get('model')}) {diff['change']}"
    where = f"{diff['field']} of {diff['uuid']}" if diff.get("uuid") else diff["field"]
    return f"{where}: {diff['from']} → {diff['to']}"


def node_inventory_reconcile(*, node: Node, actor: Actor, now=None) -> list[dict]:
    """Compare the latest report with the registered inventory; adjust capacity on drift.

    Drift records an inventory_drift event and makes the report the registered inventory
    (raw and allocatable recomputed; a vanished GPU is marked missing and unschedulable). Large
    drift, or any drift in a marketplace pool, also quarantines the node.
    """
    now = now or timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("pool").get(pk=node.pk)
        reported = node.reported_inventory
        if reported is None or node.state == NodeState.RETIRED:
            return []
        diffs, large = inventory_drift(node.inventory, reported)
        node.inventory_reconciled_at = now
        if not diffs:
            node.save(update_fields=["inventory_reconciled_at"])
            return []
        pool = node.pool
        allocatable = allocatable_from_raw(
            pool,
            cpu_millicores=reported["cpu_millicores"],
            memory_mib=reported["memory_mib"],
            scratch_mib=reported["scratch_mib"],
        )
        capped = []
        for dimension in ("cpu_millicores", "memory_mib", "scratch_mib"):
            reserved = getattr(node, f"{dimension}_reserved")
            if allocatable[f"{dimension}_allocatable"] < reserved:
                # the ledger never goes below what live leases hold; it shrinks as they end
                allocatable[f"{dimension}_allocatable"] = reserved
                capped.append(dimension)
        node.cpu_millicores_raw = reported["cpu_millicores"]
        node.memory_mib_raw = reported["memory_mib"]
        node.scratch_mib_raw = reported["scratch_mib"]
        for field, value in allocatable.items():
            setattr(node, field, value)
        node.inventory = reported
        if reported.get("numa"):
            node.numa_layout = reported["numa"]
        node.save(
            update_fields=[
                "cpu_millicores_raw",
                "memory_mib_raw",
                "scratch_mib_raw",
                *allocatable,
                "inventory",
                "numa_layout",
                "inventory_reconciled_at",
            ]
        )
        new_gpus = {g["uuid"]: g for g in reported["gpus"]}
        for gpu in node.gpus.all():
            if gpu.uuid not in new_gpus:
                gpu_mark_unsuitable(
                    gpu=gpu,
                    health=GpuHealth.MISSING,
                    flags=["missing"],
                    reason_text="no longer reported by the node",
                    actor=actor,
                    now=now,
                )
                continue
            fields = _gpu_model_fields(new_gpus.pop(gpu.uuid))
            fields.pop("index")
            GpuDevice.objects.filter(pk=gpu.pk).update(**fields)
        taken = set(node.gpus.values_list("index", flat=True))
        for gpu in new_gpus.values():
            fields = _gpu_model_fields(gpu)
            if fields["index"] in taken:
                fields["index"] = max(taken) + 1
            taken.add(fields["index"])
            GpuDevice.objects.create(node=node, **fields)
        text = "; ".join(_describe(d) for d in diffs)
        data = {"differences": diffs, "capped_by_reserved": capped, "large": large}
        _event(node, actor=actor, reason=Reason.INVENTORY_DRIFT, message=text, now=now, data=data)
        untrusted = pool.trust_level == TrustLevel.MARKETPLACE
        if (large or untrusted) and node.state != NodeState.QUARANTINED:
            node_quarantine(
                node=node,
                actor=actor,
                reason=Reason.INVENTORY_DRIFT,
                message=("large drift: " if large else "drift in an untrusted pool: ") + text,
                data=data,
                now=now,
            )
    return diffs


def inventory_reconcile_sweep(*, now=None) -> dict[int, list[dict]]:
    """Reconcile every node with a report newer than its last reconciliation."""
    now = now or timezone.now()
    actor = Actor.system("reconciliation")
    pending = (
        Node.objects.exclude(state=NodeState.RETIRED)
        .filter(inventory_reported_at__isnull=False)
        .filter(
            Q(inventory_reconciled_at__isnull=True)
            | Q(inventory_reconciled_at__lt=F("inventory_reported_at"))
        )
    )
    results = _each_node(
        pending,
        lambda node: node_inventory_reconcile(node=node, actor=actor, now=now),
        actor=actor,
        now=now,
    )
    return {pk: diffs for pk, diffs in results.items() if diffs}


# --------------------------------------------------------------------------- drain


def pool_drain_policy(pool: ComputePool) -> str:
    policy = getattr(pool, "scheduling_policy", None) if pool.pk else None
    try:
        version = policy.current if policy is not None else None
    except Exception:
        version = None
    value = (version.knobs or {}).get("drain_noncheckpointable") if version else None
    return value if value in DrainPolicy.values else DrainPolicy.FAIL


def node_drain_enforce(*, node: Node, actor: Actor, now=None) -> dict[str, list[int]]:
    """At the drain deadline: checkpointable running jobs are asked to checkpoint (re-queued
    when the agent reports the checkpoint), jobs not yet started are re-queued, the rest
    follow the pool's drain policy. Guarded: runs once per drain."""
    from jobs.choices import ACTIVE, JobState
    from jobs.models import Job
    from jobs.services import job_transition
    from leases.choices import HOLDING

    now = now or timezone.now()
    outcome = {"checkpointing": [], "requeued": [], "failed": [], "left_running": []}
    with transaction.atomic():
        claimed = Node.objects.filter(
            pk=node.pk,
            state=NodeState.DRAINING,
            drain_deadline__lte=now,
            drain_enforced_at__isnull=True,
        ).update(drain_enforced_at=now)
        if not claimed:
            return outcome
        node.refresh_from_db()
        policy = pool_drain_policy(node.pool)
        jobs = Job.objects.filter(
            leases__node=node, leases__state__in=HOLDING, state__in=ACTIVE
        ).distinct()
        why = f"drain deadline of node {node.name} passed"
        for job in jobs:
            # (to, why, outcome bucket, whether its leases end now) for each kind of work
            if job.state == JobState.RUNNING and job.checkpointable:
                step = (JobState.CHECKPOINTING, "checkpoint, then re-queue", "checkpointing", False)
            elif job.state in (JobState.LEASED, JobState.STARTING):
                step = (JobState.QUEUED, "not started, re-queued", "requeued", True)
            elif job.state == JobState.RUNNING and policy == DrainPolicy.FAIL:
                step = (
                    JobState.FAILED,
                    "not checkpointable, stopped (pool policy: fail)",
                    "failed",
                    True,
                )
            else:
                outcome["left_running"].append(job.pk)
                continue
            to, what, bucket, end_leases = step
            job_transition(
                job=job,
                to=to,
                actor=actor,
                reason=Reason.DRAIN_DEADLINE,
                message=f"{why}: {what}",
                now=now,
            )
            if end_leases:
                _end_job_leases(node, job, actor=actor, now=now)
            outcome[bucket].append(job.pk)
        _event(
            node,
            actor=actor,
            reason=Reason.DRAIN_DEADLINE,
            message=f"{why}; policy for non-checkpointable work: {policy}; "
            + ", ".join(f"{k}: {len(v)}" for k, v in outcome.items()),
            now=now,
            data=outcome | {"policy": policy},
        )
    return outcome


def _end_job_leases(node: Node, job, *, actor: Actor, now) -> None:
    from leases.choices import HOLDING

    for lease in _node_leases(node).filter(job=job, state__in=HOLDING):
        lease_services.lease_release(
            lease=lease,
            actor=actor,
            reason=Reason.RELEASED_JOB_ENDED,
            message="drain deadline",
            now=now,
        )


def node_drain_complete(*, node: Node, actor: Actor, now=None) -> bool:
    """Record that a draining node holds no leases any more (once)."""
    from leases.choices import HOLDING

    now = now or timezone.now()
    with transaction.atomic():
        if _node_leases(node).filter(state__in=HOLDING).exists():
            return False
        changed = Node.objects.filter(
            pk=node.pk, state=NodeState.DRAINING, drained_at__isnull=True
        ).update(drained_at=now)
        if changed:
            node.refresh_from_db()
            _event(
                node,
                actor=actor,
                reason=Reason.DRAIN_COMPLETED,
                message="no work left on the node; it can be retired or made ready",
                now=now,
            )
    return bool(changed)


def node_drain_sweep(*, now=None) -> dict[str, list[int]]:
    """Enforce passed drain deadlines and record drains that have completed."""
    now = now or timezone.now()
    actor = Actor.system("drain-sweep")
    due = Node.objects.filter(
        state=NodeState.DRAINING, drain_deadline__lte=now, drain_enforced_at__isnull=True
    ).select_related("pool")
    enforced = _each_node(
        due, lambda node: node_drain_enforce(node=node, actor=actor, now=now), actor=actor, now=now
    )
    completed = _each_node(
        Node.objects.filter(state=NodeState.DRAINING, drained_at__isnull=True),
        lambda node: node_drain_complete(node=node, actor=actor, now=now),
        actor=actor,
        now=now,
    )
    return {"enforced": list(enforced), "completed": [pk for pk, done in completed.items() if done]}


def agent_job_checkpointed(*, node: Node, job, actor: Actor, now=None):
    """The agent wrote the checkpoint a drain asked for: re-queue the job, end its lease here."""
    from jobs.choices import JobState
    from jobs.models import Job
    from jobs.services import job_transition
    from leases.choices import HOLDING

    now = now or timezone.now()
    if not Job.objects.filter(pk=job.pk, leases__node=node, leases__state__in=HOLDING).exists():
        raise NodeScopeRefused(f"job {job.pk} holds no lease on this node")
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=JobState.QUEUED,
            actor=actor,
            reason=Reason.CHECKPOINT_DONE,
            message=f"checkpoint written on {node.name}; re-queued",
            now=now,
        )
        _end_job_leases(node, job, actor=actor, now=now)
    return job
