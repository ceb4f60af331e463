"""Reads for pools and tenants, already filtered to what the actor may see."""

from django.utils import timezone

from .actors import Actor
from .choices import SupportGrantState
from .models import ApiToken, ComputePool, ResourceShape, SupportGrant, Tenant


def tenants_visible_to(actor):
    return Tenant.objects.visible_to(actor).order_by("slug")


def pools_visible_to(actor):
    return ComputePool.objects.visible_to(actor).order_by("slug")


def shapes_visible_to(actor):
    return (
        ResourceShape.objects.visible_to(actor)
        .select_related("pool")
        .order_by("pool__slug", "name")
    )


def tokens_visible_to(actor):
    return ApiToken.objects.visible_to(actor).order_by("-created_at")


def resolve_shape(pool: ComputePool, name: str) -> ResourceShape | None:
    return ResourceShape.objects.filter(pool=pool, name=name).first()


def support_grant_for(actor: Actor, tenant_id: int, now=None) -> SupportGrant | None:
    """The operator's active support grant for the tenant (unexpired, unrevoked), if any."""
    if not actor.is_operator:
        return None
    return (
        SupportGrant.objects.filter(
            tenant_id=tenant_id,
            operator_id=actor.user_id,
            state=SupportGrantState.ACTIVE,
            expires_at__gt=now or timezone.now(),
        )
        .order_by("-expires_at")
        .first()
    )


def tenant_data_readable(actor: Actor, tenant_id: int, now=None) -> bool:
    """The one check point for a tenant's job logs and outputs, asked on every read (API and
    console): the tenant's own people may; an operator only under an active support grant
    (pools.services.support_grant_create) from one of its admins; nobody else."""
    if actor.is_system:
        return True
    if actor.is_person and tenant_id in actor.tenant_roles:
        return True
    return support_grant_for(actor, tenant_id, now) is not None


def support_grants_visible_to(actor: Actor, tenant: Tenant):
    return (
        SupportGrant.objects.visible_to(actor)
        .filter(tenant=tenant)
        .select_related("operator", "granted_by")
    )
