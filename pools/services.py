"""Every write to tenants, roles, tokens and policy goes through here."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.utils import timezone

from .actors import Actor
from .choices import PlatformRole, TenantRole, TokenScope
from .models import (
    ApiToken,
    ComputePool,
    Membership,
    SchedulingPolicy,
    SchedulingPolicyVersion,
    Tenant,
    new_token_secret,
    token_digest,
)

# Models a policy admin edits in the Django admin.
POLICY_MODELS = (
    "resourceshape",
    "priorityclass",
    "quota",
    "schedulingpolicy",
    "schedulingpolicyversion",
    "allowedregistry",
    "computepool",
)

DEFAULT_POLICY_WEIGHTS = {"fragmentation": 1.0, "binpack": 0.2, "locality": 0.1, "warm_image": 0.1}


def membership_set(*, user, tenant: Tenant, role: str = TenantRole.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": role}
    )
    return membership


def platform_role_grant(*, user, role: str) -> None:
    """Operators and policy admins are groups; policy admins also get the admin permissions."""
    group, _ = Group.objects.get_or_create(name=role)
    if role == PlatformRole.POLICY_ADMIN and not group.permissions.exists():
        group.permissions.set(
            Permission.objects.filter(
                content_type__app_label="pools", content_type__model__in=POLICY_MODELS
            )
        )
    user.groups.add(group)
    if role == PlatformRole.POLICY_ADMIN and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    user.__dict__.pop("_platform_roles", None)


@transaction.atomic
def pool_create(*, name: str, slug: str, actor: Actor | None = None, **fields) -> ComputePool:
    """A pool always has a scheduling policy with a first version."""
    pool = ComputePool.objects.create(name=name, slug=slug, **fields)
    policy = SchedulingPolicy.objects.create(pool=pool)
    SchedulingPolicyVersion.objects.create(
        policy=policy,
        number=1,
        weights=dict(DEFAULT_POLICY_WEIGHTS),
        comment="initial",
        created_by=actor.user if actor else None,
    )
    return pool


@transaction.atomic
def policy_version_publish(
    *,
    policy: SchedulingPolicy,
    weights: dict,
    knobs: dict | None = None,
    comment: str = "",
    actor: Actor,
) -> SchedulingPolicyVersion:
    """Editing a policy publishes version n+1; earlier versions stay as decisions recorded them."""
    policy = SchedulingPolicy.objects.select_for_update().get(pk=policy.pk)
    last = policy.versions.order_by("-number").values_list("number", flat=True).first() or 0
    return SchedulingPolicyVersion.objects.create(
        policy=policy,
        number=last + 1,
        weights=weights,
        knobs=knobs or {},
        comment=comment,
        created_by=actor.user,
    )


def api_token_issue(
    *, user, name: str, scopes: list[str] | None = None, ttl: timedelta | None = None, now=None
) -> tuple[ApiToken, str]:
    """Returns the token row and its secret; the secret is never stored and never shown again."""
    now = now or timezone.now()
    scopes = scopes or [TokenScope.READ, TokenScope.WRITE]
    unknown = set(scopes) - set(TokenScope.values)
    if unknown:
        raise ValueError(f"unknown scopes: {sorted(unknown)}")
    secret = new_token_secret("u")
    token = ApiToken.objects.create(
        user=user,
        name=name,
        digest=token_digest(secret),
        prefix=secret[:10],
        scopes=sorted(scopes),
        created_at=now,
        expires_at=now + (ttl or settings.API_TOKEN_DEFAULT_TTL),
    )
    return token, secret


def api_token_revoke(*, token: ApiToken, now=None) -> ApiToken:
    # Guarded: revoking twice keeps the first revocation time.
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now()
    )
    token.refresh_from_db(fields=["revoked_at"])
    return token


def tenant_create(*, name: str, slug: str) -> Tenant:
    return Tenant.objects.create(name=name, slug=slug)


def api_tokens_purge(*, now, keep=timedelta(days=30)) -> int:
    """Forget tokens expired or revoked more than `keep` ago (they can never work again)."""
    cutoff = now - keep
    expired = ApiToken.objects.filter(expires_at__lt=cutoff)
    revoked = ApiToken.objects.filter(revoked_at__lt=cutoff)
    deleted, _ = (expired | revoked).delete()
    return deleted
