"""Node credentials (`cpn_…`, bound to one node): issue, agent rotation with a short overlap,
operator reissue and revocation, and the lookup the authentication class uses."""

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from pools.actors import Actor
from pools.models import new_token_secret, token_digest
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from ..choices import NodeState
from ..conf import setting
from ..models import Node, NodeCredential
from .base import node_event

CREDENTIAL_PREFIX = "cpn_"


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
        node_event(
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


def node_credential_reissue(
    *, node: Node, actor: Actor, message: str = "", now=None
) -> tuple[NodeCredential, str]:
    """Operator rotation: a new credential, shown once; current ones keep a short overlap.
    `message`: the operator's reason, recorded on the event."""
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
        node_event(
            node,
            actor=actor,
            reason=Reason.CREDENTIAL_ROTATED,
            message=message or f"new credential {new.prefix}… issued by an operator",
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
        node_event(
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
