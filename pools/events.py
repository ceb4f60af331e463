"""Live events: once a transition commits, a wake-up goes to the Channels groups that websocket
consumers (pools/consumers.py) follow. The message carries nothing: a woken consumer reads what
its socket may see from the event table, past its cursor, so a message's content would only be
read by nobody.

One stream per kind of entity ("jobs", "leases", "nodes"), so a socket of one stream never
receives another's events. Inside a stream the groups follow the model's `visibility` rule
(pools.visibility), the API's: an event goes to the stream's operators, to its object's own
group and, for a tenant-owned model, to that tenant's members; a person subscribes to the
groups of what the API would show them.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from .actors import Actor

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "entity.event"  # handled by EventsConsumer.entity_event


def operators_group(stream: str) -> str:
    return f"{stream}.operators"


def tenant_group(stream: str, tenant_id: int) -> str:
    return f"{stream}.tenant-{tenant_id}"


def object_group(stream: str, pk: int) -> str:
    return f"{stream}.{pk}"


def _tenant_field(model) -> str:
    """The model's FK to its tenant ("tenant"), or "" when only operators see it whole."""
    return model.visibility.tenant


def groups_of(stream: str, obj, model=None) -> list[str]:
    """Every group that may see an event of `obj`, by the visibility rule of `model` (default:
    its type; give it for a plain record of a row, with the row's `pk` and tenant id)."""
    groups = [operators_group(stream), object_group(stream, obj.pk)]
    if tenant_field := _tenant_field(model or type(obj)):
        groups.append(tenant_group(stream, getattr(obj, f"{tenant_field}_id")))
    return groups


def subscriptions(stream: str, model, actor: Actor, pk: int | None = None) -> list[str]:
    """The groups `actor` may follow: one object the API shows them, or the whole stream as
    the API lists it (operators everything, a member their tenants' rows). Empty: refused."""
    if pk is not None:
        visible = model.objects.visible_to(actor).filter(pk=pk).exists()
        return [object_group(stream, pk)] if visible else []
    if actor.is_operator:
        return [operators_group(stream)]
    if _tenant_field(model):
        return [tenant_group(stream, tenant_id) for tenant_id in actor.tenant_ids]
    return []


def event_fields(event) -> dict:
    """What every stream says about a transition (an EventBase row), as consumers send it."""
    return {
        "at": event.at.isoformat(),
        "from": event.from_state,
        "to": event.to_state,
        "reason": event.reason,
        "message": event.message,
        "actor": event.actor_label,
    }


def publish_event(groups) -> None:
    """Wake the consumers of `groups`; call it on commit. The database is the source of truth
    (and the consumers re-read it every 5 s), so a broken channel layer is logged and never
    fails or undoes the transition that already committed."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": MESSAGE_TYPE}

    async def send_all():  # one event loop for all groups: each async_to_sync starts one
        for group in groups:
            await layer.group_send(group, message)

    try:
        async_to_sync(send_all)()
    except Exception:
        logger.warning("could not publish an event to %s", groups, exc_info=True)
