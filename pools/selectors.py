"""Reads for pools and tenants, already filtered to what the asker may see."""

from .models import ApiToken, ComputePool, ResourceShape, Tenant


def tenants_visible_to(user):
    return Tenant.objects.visible_to(user).order_by("slug")


def pools_visible_to(user):
    # Pools are shared infrastructure: every signed-in person may see their names and shapes.
    return ComputePool.objects.order_by("slug")


def shapes_visible_to(user):
    return ResourceShape.objects.select_related("pool").order_by("pool__slug", "name")


def tokens_of(user):
    return ApiToken.objects.filter(user=user).order_by("-created_at")


def resolve_shape(pool: ComputePool, name: str) -> ResourceShape | None:
    return ResourceShape.objects.filter(pool=pool, name=name).first()
