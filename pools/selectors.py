"""Reads for pools and tenants, already filtered to what the actor may see."""

from .models import ApiToken, ComputePool, ResourceShape, Tenant


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
