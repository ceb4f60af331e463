"""Every write to tenants, roles, tokens and policy goes through here."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from placement import DEFAULT_POLICY

from . import encryption, objectstore, validation
from .actors import Actor
from .choices import (
    OPERATOR_SCOPES,
    SUPPORT_GRANT_TRANSITIONS,
    PlatformRole,
    SupportGrantState,
    TenantRole,
    TokenScope,
)
from .knobs import policy_version, version_published
from .models import (
    ApiToken,
    ComputePool,
    CreditAccount,
    CreditCharge,
    Membership,
    MembershipEvent,
    SchedulingPolicy,
    SchedulingPolicyVersion,
    SupportGrant,
    SupportGrantEvent,
    Tenant,
    TenantBucket,
    TenantBucketEvent,
    TenantSecret,
    new_token_secret,
    token_digest,
)
from .reasons import Reason
from .roles import has_platform_role, is_operator
from .statemachine import TransitionRefused, transition
from .sweeps import sweep

logger = logging.getLogger(__name__)

# The models each admin role edits in the Django admin: shape admins define the catalogue,
# policy admins the scheduling policy (quotas, credit, priorities, registries, versions).
ADMIN_MODELS = {
    PlatformRole.SHAPE_ADMIN: ("resourceshape",),
    PlatformRole.POLICY_ADMIN: (
        "priorityclass",
        "quota",
        "creditaccount",
        "creditcharge",
        "schedulingpolicy",
        "schedulingpolicyversion",
        "allowedregistry",
        "computepool",
        "pooltrustedkey",
    ),
}


def _membership_event(
    membership: Membership, *, actor: Actor, reason: str, from_role: str, to_role: str
) -> MembershipEvent:
    """The event of one change to `membership`: keyed by its tenant and the member's username,
    so it outlives the row when the member is removed."""
    username = membership.user.get_username()
    event = MembershipEvent.build(
        membership.tenant,
        actor=actor,
        from_state=from_role,
        to_state=to_role,
        reason=reason,
        message=f"{username}: {from_role or '∅'} → {to_role}",
        data={"member": username, "from_role": from_role, "to_role": to_role},
    )
    event.username, event.user = username, membership.user
    event.save()
    return event


@transaction.atomic
def membership_set(
    *, user, tenant: Tenant, role: str = TenantRole.MEMBER, actor: Actor
) -> Membership:
    """`user` belongs to `tenant` in `role` (added, or their role changed), with its event; an
    unchanged membership writes none. No last-admin check: see member_add for tenant admins."""
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    if membership is None:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
        _membership_event(
            membership, actor=actor, reason=Reason.MEMBER_ADDED, from_role="", to_role=role
        )
    elif membership.role != role:
        before, membership.role = membership.role, role
        membership.save(update_fields=["role"])
        _membership_event(
            membership,
            actor=actor,
            reason=Reason.MEMBER_ROLE_CHANGED,
            from_role=before,
            to_role=role,
        )
    return membership


@transaction.atomic
def member_add(*, tenant: Tenant, username: str, role: str, actor: Actor) -> Membership | None:
    """A tenant admin adds a person by username. Unknown or inactive names and holders of a
    platform role (operators, policy admins: they stay out of tenants) are skipped silently,
    because the caller's answer must not tell these apart from a real add (no enumeration).
    Adding someone who already belongs changes their role, as member_role_change does (so the
    tenant's last admin is not demoted this way either: 409 `last_admin`)."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or has_platform_role(user, *PlatformRole.values):
        return None
    existing = Membership.objects.filter(user=user, tenant=tenant).select_related("user").first()
    if existing is not None:
        return member_role_change(membership=existing, role=role, actor=actor)
    return membership_set(user=user, tenant=tenant, role=role, actor=actor)


def _last_admin_refusal(membership: Membership, doing: str) -> TransitionRefused | None:
    """A tenant keeps at least one admin: `doing` (remove, demote) its last one is refused."""
    if membership.role != TenantRole.ADMIN:
        return None
    admins = Membership.objects.filter(tenant_id=membership.tenant_id, role=TenantRole.ADMIN)
    # the tenant's admin rows locked, so two admins demoting each other cannot both succeed
    if len(admins.select_for_update().values_list("pk", flat=True)) > 1:
        return None
    return TransitionRefused(
        Reason.LAST_ADMIN,
        f"{membership.user.get_username()} is the last admin of {membership.tenant.slug}: "
        f"add another admin before you {doing} them.",
    )


@transaction.atomic
def member_role_change(*, membership: Membership, role: str, actor: Actor) -> Membership:
    """A tenant admin changes a member's role; demoting the tenant's last admin is refused
    (409 `last_admin`). Writes a `member_role_changed` MembershipEvent."""
    if role == membership.role:
        return membership
    if role != TenantRole.ADMIN and (refusal := _last_admin_refusal(membership, "demote")):
        raise refusal
    before, membership.role = membership.role, role
    membership.save(update_fields=["role"])
    _membership_event(
        membership, actor=actor, reason=Reason.MEMBER_ROLE_CHANGED, from_role=before, to_role=role
    )
    return membership


@transaction.atomic
def member_remove(*, membership: Membership, actor: Actor) -> None:
    """A tenant admin removes a member; removing the tenant's last admin is refused (409
    `last_admin`). The person keeps their account, tokens and jobs; they no longer see the
    tenant's work nor act for it. Writes a `member_removed` MembershipEvent, kept after the
    row is gone."""
    if refusal := _last_admin_refusal(membership, "remove"):
        raise refusal
    _membership_event(
        membership,
        actor=actor,
        reason=Reason.MEMBER_REMOVED,
        from_role=membership.role,
        to_role=MembershipEvent.REMOVED,
    )
    membership.delete()


def platform_role_grant(*, user, role: str) -> None:
    """Platform roles are groups; the admin roles also get their models' admin permissions
    (ADMIN_MODELS, set again on every grant) and the admin site."""
    group, _ = Group.objects.get_or_create(name=role)
    if role in ADMIN_MODELS:
        group.permissions.set(
            Permission.objects.filter(
                content_type__app_label="pools", content_type__model__in=ADMIN_MODELS[role]
            )
        )
    user.groups.add(group)
    if role in ADMIN_MODELS and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    user.__dict__.pop("_platform_roles", None)


@transaction.atomic
def pool_create(*, name: str, slug: str, actor: Actor | None = None, **fields) -> ComputePool:
    """A pool always has a scheduling policy; its first version is the core's default."""
    pool = ComputePool.objects.create(name=name, slug=slug, **fields)
    policy = SchedulingPolicy.objects.create(pool=pool)
    SchedulingPolicyVersion.objects.create(
        policy=policy,
        number=1,
        weights=dict(DEFAULT_POLICY.weights),
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
    """Editing a policy publishes version n+1; earlier versions stay as decisions recorded them.
    The pool's cached version (pools/knobs.py) goes when this commits."""
    policy_version(weights, knobs or {})  # a bad knob would break every reservation
    policy = SchedulingPolicy.objects.select_for_update().get(pk=policy.pk)
    last = policy.versions.order_by("-number").values_list("number", flat=True).first() or 0
    version = SchedulingPolicyVersion.objects.create(
        policy=policy,
        number=last + 1,
        weights=weights,
        knobs=knobs or {},
        comment=comment,
        created_by=actor.user,
    )
    version_published(policy.pool_id)
    return version


# What a token holds when its request names no scopes: everything but `operate`.
DEFAULT_TOKEN_SCOPES = (
    TokenScope.READ,
    TokenScope.LOGS_READ,
    TokenScope.OUTPUTS_READ,
    TokenScope.WRITE,
)


def api_token_issue(
    *,
    user,
    name: str,
    scopes: list[str] | None = None,
    ttl: timedelta | None = None,
    now=None,
    parent: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Returns the token row and its secret; the secret is never stored and never shown again.

    A token never holds more than what minted it: `operate` only for operators, and a token
    minted with another token (`parent`) has none of the scopes the parent lacks and expires no
    later. Asking for more is a field error (400), never silently cut down; what is left out of
    the request (scopes, ttl) defaults to the most the parent allows.
    """
    now = now or timezone.now()
    if scopes is None:
        scopes = [s for s in DEFAULT_TOKEN_SCOPES if parent is None or parent.allows(s)]
    scopes = sorted(set(scopes))
    expires_at = now + (ttl or settings.API_TOKEN_DEFAULT_TTL)
    if ttl is None and parent is not None:
        expires_at = min(expires_at, parent.expires_at)
    errors = {}
    unknown = set(scopes) - set(TokenScope.values)
    beyond_parent = set(scopes) - set(parent.scopes) if parent is not None else set()
    if not scopes:
        errors["scopes"] = "Give at least one scope."
    elif unknown:
        errors["scopes"] = f"Unknown scopes: {', '.join(sorted(unknown))}."
    elif OPERATOR_SCOPES.intersection(scopes) and not is_operator(user):
        held = ", ".join(sorted(OPERATOR_SCOPES.intersection(scopes)))
        errors["scopes"] = f"Only operators may hold the {held} scope."
    elif beyond_parent:
        errors["scopes"] = (
            f"The token you are using lacks {', '.join(sorted(beyond_parent))}; "
            "a token cannot grant more than it holds."
        )
    if parent is not None and expires_at > parent.expires_at:
        errors["ttl_days"] = (
            "A token minted with a token cannot outlive it; yours expires at "
            f"{parent.expires_at:%Y-%m-%d %H:%M} UTC."
        )
    if errors:
        raise ValidationError(errors)
    secret = new_token_secret("u")
    token = ApiToken.objects.create(
        user=user,
        name=name,
        digest=token_digest(secret),
        prefix=secret[:10],
        scopes=scopes,
        created_at=now,
        expires_at=expires_at,
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


def tenant_secret_set(*, tenant: Tenant, name: str, value: str, now=None) -> TenantSecret:
    """Creates or replaces a tenant's secret; jobs refer to it by name. The value is never
    logged or returned (jobs started later get the new value)."""
    validation.secret_name(name)
    validation.secret_value(value)
    now = now or timezone.now()
    secret = TenantSecret(tenant=tenant, name=name)
    secret.seal(value)
    secret, _ = TenantSecret.objects.update_or_create(
        tenant=tenant,
        name=name,
        defaults={"ciphertext": secret.ciphertext, "key_id": secret.key_id, "updated_at": now},
    )
    return secret


def tenant_secrets_reencrypt() -> int:
    """Re-encrypts every secret not sealed under the current key (key rotation: put the new
    key first in ENCRYPTION_KEYS, run this, then drop the old key); how many it re-sealed.
    Each row under its own lock, so a secret replaced meanwhile is never overwritten."""
    current = encryption.current_key_id()
    done = 0
    for pk in TenantSecret.objects.exclude(key_id=current).values_list("pk", flat=True):
        with transaction.atomic():
            secret = TenantSecret.objects.select_for_update().filter(pk=pk).first()
            if secret is None or secret.key_id == current:
                continue
            secret.seal(secret.reveal())
            secret.save(update_fields=["ciphertext", "key_id"])
            done += 1
    return done


def tenant_secret_delete(*, secret: TenantSecret) -> None:
    """Jobs that still name it can no longer receive its value when they start."""
    secret.delete()


def _bucket_event(tenant: Tenant, bucket: str, *, actor: Actor, reason: str, to: str, data: dict):
    event = TenantBucketEvent.build(
        tenant,
        actor=actor,
        from_state="" if to == "registered" else "registered",
        to_state=to,
        reason=reason,
        message=f"s3://{bucket} {to}",
        data={"bucket": bucket} | data,
    )
    event.bucket = bucket
    event.save()
    return event


def bucket_register(
    *,
    tenant: Tenant,
    bucket: str,
    endpoint: str,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    server_side_encryption: str = "",
    actor: Actor,
) -> TenantBucket:
    """A tenant admin registers a bucket of an OBJECT_STORE_ENDPOINTS store with the tenant's
    credentials, after a HEAD of the bucket with them (ValidationError on the field to fix:
    nothing is stored when the store refuses). A bucket registered again is replaced (new
    credentials: a rotation). Writes a `bucket_registered` TenantBucketEvent."""
    if not objectstore.registered_endpoint(endpoint):
        raise ValidationError({"endpoint": "Not an endpoint of OBJECT_STORE_ENDPOINTS."})
    target = objectstore.Target(
        endpoint, region, bucket, access_key_id, secret_access_key, server_side_encryption
    )
    try:
        objectstore.check_bucket(target)
    except objectstore.StoreError as error:
        raise ValidationError({error.field: error.message}) from None
    with transaction.atomic():
        row = TenantBucket.objects.select_for_update().filter(tenant=tenant, bucket=bucket).first()
        row = row or TenantBucket(tenant=tenant, bucket=bucket)
        row.endpoint, row.region = endpoint, region
        row.server_side_encryption = server_side_encryption
        row.created_by = actor.user if actor.user_id else None
        row.created_at = timezone.now()
        row.seal(access_key_id, secret_access_key)
        row.save()
        _bucket_event(
            tenant,
            bucket,
            actor=actor,
            reason=Reason.BUCKET_REGISTERED,
            to="registered",
            data={"endpoint": endpoint, "region": region, "sse": server_side_encryption},
        )
    return row


@transaction.atomic
def bucket_remove(*, row: TenantBucket, actor: Actor) -> None:
    """Jobs that name it afterwards are refused at submit; a queued one whose inputs are in it
    fails `input_unavailable` when placed. Objects already in the bucket stay (they are the
    tenant's). Writes a `bucket_removed` TenantBucketEvent, kept after the row is gone."""
    _bucket_event(
        row.tenant, row.bucket, actor=actor, reason=Reason.BUCKET_REMOVED, to="removed", data={}
    )
    row.delete()


def tenant_buckets_reencrypt() -> int:
    """Re-seals every bucket's credentials not under the current key (the rotation of
    tenant_secrets_reencrypt); how many."""
    current = encryption.current_key_id()
    done = 0
    for pk in TenantBucket.objects.exclude(key_id=current).values_list("pk", flat=True):
        with transaction.atomic():
            row = TenantBucket.objects.select_for_update().filter(pk=pk).first()
            if row is None or row.key_id == current:
                continue
            row.seal(*row.reveal())
            row.save(update_fields=["ciphertext", "key_id"])
            done += 1
    return done


def credit_top_up(account: CreditAccount, amount, *, by: str, note: str = "", now=None):
    """Adds `amount` (> 0) to a tenant's credit balance under the account's row lock, with its
    ledger row (a policy admin's top-up, from the admin)."""
    if amount <= 0:
        raise ValidationError({"amount": "A top-up is a positive amount."})
    now = now or timezone.now()
    with transaction.atomic():
        locked = CreditAccount.objects.select_for_update().get(pk=account.pk)
        locked.balance += amount
        locked.updated_at = now
        locked.save(update_fields=["balance", "updated_at"])
        account.balance, account.updated_at = locked.balance, now
        return CreditCharge.objects.create(
            account=locked,
            kind=CreditCharge.Kind.TOP_UP,
            amount=amount,
            balance_after=locked.balance,
            note=f"{by}: {note}" if note else by,
            created_at=now,
        )


SUPPORT_GRANT_MAX_TTL = timedelta(days=7)


@transaction.atomic
def support_grant_create(
    *, tenant: Tenant, operator: str, ttl: timedelta, reason: str, actor: Actor, now=None
) -> SupportGrant:
    """A tenant admin (`actor`, checked by the caller) lets the operator named `operator` read
    the tenant's job logs and outputs for `ttl` (at most SUPPORT_GRANT_MAX_TTL); recorded as a
    `support_granted` event. A name that is no active operator is a field error."""
    now = now or timezone.now()
    user = get_user_model().objects.filter(username=operator, is_active=True).first()
    if user is None or not is_operator(user):
        raise ValidationError({"operator": "Name an active operator."})
    if not timedelta(0) < ttl <= SUPPORT_GRANT_MAX_TTL:
        raise ValidationError({"ttl_hours": "A support grant lasts between 1 hour and 7 days."})
    grant = SupportGrant.objects.create(
        tenant=tenant,
        operator=user,
        granted_by=actor.user,
        reason=reason,
        created_at=now,
        state_changed_at=now,
        expires_at=now + ttl,
    )
    SupportGrantEvent.record(
        grant,
        actor=actor,
        from_state="",
        to_state=SupportGrantState.ACTIVE,
        reason=Reason.SUPPORT_GRANTED,
        message=f"{user.get_username()} may read {tenant.slug}'s logs and outputs until "
        f"{grant.expires_at:%Y-%m-%d %H:%M} UTC",
        at=now,
        data={"operator": user.get_username(), "reason": reason},
    )
    return grant


def support_grant_revoke(*, grant: SupportGrant, actor: Actor, now=None) -> SupportGrant:
    """Ends the grant before its expiry (409 once it has ended)."""
    now = now or timezone.now()
    return transition(
        SupportGrant,
        grant.pk,
        to=SupportGrantState.REVOKED,
        allowed=SUPPORT_GRANT_TRANSITIONS,
        event_model=SupportGrantEvent,
        actor=actor,
        reason=Reason.SUPPORT_REVOKED,
        message=f"revoked by {actor.label}",
        now=now,
        changes={"revoked_at": now},
    )


def support_grants_expire(*, now) -> int:
    """Records the expiry of every active grant past its `expires_at` (the reads refuse them
    from that moment on anyway: pools.selectors.tenant_data_readable)."""
    actor = Actor.system("support-grant-expiry")
    due = SupportGrant.objects.filter(state=SupportGrantState.ACTIVE, expires_at__lte=now)
    expired = sweep(
        due,
        lambda grant: transition(
            SupportGrant,
            grant.pk,
            to=SupportGrantState.EXPIRED,
            allowed=SUPPORT_GRANT_TRANSITIONS,
            event_model=SupportGrantEvent,
            actor=actor,
            reason=Reason.SUPPORT_EXPIRED,
            message="reached its expiry",
            now=now,
        ),
        event_model=SupportGrantEvent,
        actor=actor,
        now=now,
    )
    return len(expired)
