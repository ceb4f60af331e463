"""Enrollment: operators issue tokens (`cpe_…`) for a pool; a token holder joins the pool as a
`registered` node with its credential (and a validation probe in a marketplace pool)."""

import hashlib
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.choices import TrustLevel
from pools.models import ComputePool, new_token_secret, token_digest

from ..choices import ProbeKind
from ..errors import EnrollmentRefused
from ..inventory import normalize_inventory
from ..models import EnrollmentToken, Node, NodeProbe
from .credentials import node_credential_issue
from .lifecycle import node_register
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
