"""A node's key (docs/security.md "Node identity"): bound at enrollment, rotated by the agent
with proof of both keys, and every refused signature on the node's credential recorded."""

from __future__ import annotations

import base64

from cryptography.exceptions import InvalidSignature
from django.core.cache import caches
from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from worker_agent.identity import rotation_statement

from ..models import Node
from ..signatures import fingerprint_of, public_key_from
from .base import node_event

SIGNATURE_EVENT_EVERY_S = 60  # at most one `signature_refused` event a minute per node


def checked_public_key(text) -> str:
    """`text` when it is an Ed25519 public key (base64 of 32 raw bytes), else ValueError."""
    public_key_from(text)
    return str(text)


def node_key_bind(*, node: Node, public_key: str, actor: Actor, now=None) -> Node:
    """Binds `public_key` to a node that has none (enrollment, under the node's row lock)."""
    node.public_key = checked_public_key(public_key)
    node.identity_fingerprint = fingerprint_of(public_key)
    node.save(update_fields=["public_key", "identity_fingerprint"])
    node_event(
        node,
        actor=actor,
        reason=Reason.NODE_KEY_BOUND,
        message=f"key {node.identity_fingerprint[:16]}… bound",
        now=now,
        data={"fingerprint": node.identity_fingerprint},
    )
    return node


def node_key_rotate(*, node: Node, public_key: str, proof: str, actor: Actor, now=None) -> Node:
    """Replaces the node's key. The request itself was signed by the old key (authentication);
    `proof` is the new key's signature over `rotation_statement`, so a key nobody holds can
    never be bound. The node, its credentials and its leases stay as they are."""
    now = now or timezone.now()
    try:
        new_key = public_key_from(public_key)
        signature = base64.b64decode(str(proof), validate=True)
    except ValueError as exc:
        raise TransitionRefused("node_key_invalid", f"Not a usable key or proof: {exc}.") from exc
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        old, new = node.identity_fingerprint, fingerprint_of(public_key)
        if new == old:
            raise TransitionRefused("node_key_unchanged", "This key is already the node's.")
        try:
            new_key.verify(signature, rotation_statement(node.pk, old, new))
        except InvalidSignature as exc:
            raise TransitionRefused(
                "node_key_proof_invalid", "The proof is not the new key's signature."
            ) from exc
        node.public_key, node.identity_fingerprint = str(public_key), new
        node.save(update_fields=["public_key", "identity_fingerprint"])
        node_event(
            node,
            actor=actor,
            reason=Reason.NODE_KEY_ROTATED,
            message=f"key {old[:16]}… replaced by {new[:16]}…",
            now=now,
            data={"old": old, "new": new},
        )
    return node


def signature_refused(*, node: Node, why: str, now=None) -> None:
    """Records that a request on the node's credential came without a valid signature: a
    stolen credential at work, or a broken agent. At most one event a minute per node, so that
    whoever holds the credential cannot fill the event log."""
    try:
        first = caches["nonces"].add(
            f"refused:{node.identity_fingerprint}", 1, SIGNATURE_EVENT_EVERY_S
        )
    except Exception:  # the store is down: the request is refused anyway (503), not recorded
        return
    if not first:
        return
    node_event(
        node,
        actor=Actor.system("node-identity"),
        reason=Reason.SIGNATURE_REFUSED,
        message=why[:300],
        now=now,
    )
