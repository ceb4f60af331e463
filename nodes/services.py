"""Node lifecycle and inventory writes. Every state change writes a NodeEvent."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import transition

from .choices import NODE_TRANSITIONS, NodeState
from .models import GpuDevice, Node, NodeEvent


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
    **fields,
) -> Node:
    """Create a node in `registered` with its inventory; it is not schedulable yet."""
    node = Node.objects.create(
        pool=pool,
        name=name,
        cpu_millicores_raw=cpu_millicores,
        memory_mib_raw=memory_mib,
        scratch_mib_raw=scratch_mib,
        **allocatable_from_raw(
            pool, cpu_millicores=cpu_millicores, memory_mib=memory_mib, scratch_mib=scratch_mib
        ),
        **fields,
    )
    GpuDevice.objects.bulk_create(GpuDevice(node=node, **gpu) for gpu in gpus or [])
    NodeEvent.record(
        node,
        actor=actor,
        from_state="",
        to_state=node.state,
        reason=reason,
        message=f"registered in pool {pool.slug}",
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
    )


def node_verify(
    *, node: Node, actor: Actor, reason: str = Reason.AGENT_AUTHENTICATED, message: str = ""
) -> Node:
    return node_transition(
        node=node, to=NodeState.VERIFIED, actor=actor, reason=reason, message=message
    )


def node_mark_ready(
    *, node: Node, actor: Actor, reason: str = Reason.OPERATOR_ACTION, message: str = ""
) -> Node:
    return node_transition(
        node=node, to=NodeState.READY, actor=actor, reason=reason, message=message
    )


def node_drain(*, node: Node, actor: Actor, message: str = "") -> Node:
    return node_transition(
        node=node,
        to=NodeState.DRAINING,
        actor=actor,
        reason=Reason.DRAIN_REQUESTED,
        message=message,
    )


def node_quarantine(
    *,
    node: Node,
    actor: Actor,
    message: str,
    reason: str = Reason.QUARANTINED,
    data: dict | None = None,
) -> Node:
    return node_transition(
        node=node, to=NodeState.QUARANTINED, actor=actor, reason=reason, message=message, data=data
    )


def node_retire(*, node: Node, actor: Actor, message: str = "") -> Node:
    return node_transition(
        node=node, to=NodeState.RETIRED, actor=actor, reason=Reason.RETIRED, message=message
    )
