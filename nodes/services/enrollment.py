"""Enrollment: operators issue tokens (`cpe_…`) for a pool; a token holder joins the pool as a
`registered` node with its credential (and a validation probe in a marketplace pool)."""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.choices import TrustLevel
from pools.knobs import knobs_for
from pools.models import ComputePool, new_token_secret, token_digest
from pools.reasons import Reason

from ..choices import NodeState, ProbeKind
from ..errors import EnrollmentRefused
from ..inventory import normalize_inventory
from ..models import EnrollmentToken, Node, NodeCredential, NodeProbe
from ..signatures import fingerprint_of
from .base import node_event
from .credentials import node_credential_issue
from .identity import node_key_bind
from .lifecycle import node_quarantine, node_register
from .probes import probe_request

ENROLLMENT_PREFIX = "cpe_"


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


def node_enroll(
    *,
    secret: str,
    name: str,
    inventory: dict,
    public_key: str,
    now=None,
    **fields,
) -> tuple[Node, str, NodeProbe | None]:
    """A token holder joins the token's pool: node `registered`, its credential, maybe a probe.
    `public_key` (Ed25519, base64; the enrollment request was signed by it) is bound to the
    node: every later request on the credential must be signed by it.

    Enrolling as a node of the pool that already exists (by name) is re-enrollment: with the
    key bound to it (an agent that lost its state dir but kept its key) it gets a new
    credential and every older one is revoked; a node no agent has enrolled as yet (an
    operator registered it) gets this key; another key is refused (`identity_key_mismatch`,
    the existing node quarantined too when the pool's `reenrollment_key_mismatch` says so).

    Returns (node, credential secret shown once, validation probe for marketplace pools).
    """
    now = now or timezone.now()
    actor = Actor(kind="node", label=f"node:{name}")
    mismatch = None
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
        pool = token.pool
        existing = Node.objects.select_for_update().filter(pool=pool, name=name).first()
        known = existing is not None and existing.public_key
        if known and existing.identity_fingerprint != fingerprint_of(public_key):
            mismatch = _key_mismatch(existing, public_key, actor=actor, now=now)
        if mismatch is None:
            token.uses += 1
            token.save(update_fields=["uses"])
            node, probe = _enrolled(pool, token, existing, name, inventory, public_key, now, fields)
            _, credential_secret = node_credential_issue(node=node, now=now)
    if mismatch is not None:  # its events are kept: the refusal is raised after the commit
        raise mismatch
    return node, credential_secret, probe


def _enrolled(pool, token, existing, name, inventory, public_key, now, fields):
    """The node this enrollment is: a new one, or the existing one re-enrolled."""
    actor = Actor(kind="node", label=f"node:{name}")
    if existing is not None:
        if existing.state == NodeState.RETIRED:
            raise EnrollmentRefused(f"Node {name} is retired; enroll under another name.")
        if existing.public_key:
            revoked = NodeCredential.objects.filter(node=existing, revoked_at__isnull=True)
            count = revoked.update(revoked_at=now)
            node_event(
                existing,
                actor=actor,
                reason=Reason.NODE_REENROLLED,
                message=f"enrolled again with its key; {count} older credential(s) revoked",
                now=now,
                data={"token": token.prefix, "revoked": count},
            )
        else:  # registered by an operator: its agent's key from now on
            node_key_bind(node=existing, public_key=public_key, actor=actor, now=now)
        return existing, None
    claims = normalize_inventory(inventory)
    node = node_register(
        pool=pool,
        name=name,
        actor=actor,
        cpu_millicores=claims["cpu_millicores"],
        memory_mib=claims["memory_mib"],
        scratch_mib=claims["scratch_mib"],
        gpus=claims["gpus"],
        now=now,
        inventory=claims,
        numa_layout=claims["numa"],
        enrollment_token=token,
        public_key=public_key,  # bound from the start: its `enrolled` event is the binding
        identity_fingerprint=fingerprint_of(public_key),
        **fields,
    )
    probe = None
    if pool.trust_level == TrustLevel.MARKETPLACE:
        probe = probe_request(
            node=node,
            kind=ProbeKind.VALIDATION,
            actor=Actor.system("verification"),
            now=now,
        )
    return node, probe


def _key_mismatch(node: Node, public_key: str, *, actor: Actor, now) -> EnrollmentRefused:
    """Records an enrollment as `node` with another key (and quarantines it by policy);
    returns the refusal to raise once that is committed."""
    presented = fingerprint_of(public_key)
    policy = knobs_for(node.pool).reenrollment_key_mismatch
    data = {"bound": node.identity_fingerprint, "presented": presented, "policy": policy}
    message = f"enrollment as {node.name} with key {presented[:16]}…, not its own"
    node_event(
        node, actor=actor, reason=Reason.IDENTITY_KEY_MISMATCH, message=message, now=now, data=data
    )
    if policy == "quarantine" and node.state not in (NodeState.QUARANTINED, NodeState.RETIRED):
        node_quarantine(
            node=node,
            actor=Actor.system("node-identity"),
            message=message,
            reason=Reason.IDENTITY_KEY_MISMATCH,
            data=data,
            now=now,
        )
    refusal = EnrollmentRefused(
        f"Node {node.name} exists with another key; enroll under another name, or ask an "
        "operator to retire it."
    )
    refusal.code = Reason.IDENTITY_KEY_MISMATCH.value
    return refusal
