from django.db.models import OuterRef, Subquery

from leases.models import Lease
from pools.images import parse_image_reference

from .models import Job


def jobs_visible_to(actor):
    return Job.objects.visible_to(actor).select_related("tenant", "pool", "shape", "priority_class")


def jobs_for_console(actor, limit: int = 100):
    """With the node of each job's newest lease, so people see where their work landed."""
    newest = Lease.objects.filter(job=OuterRef("pk")).order_by("-created_at", "-id")
    return jobs_visible_to(actor).annotate(node_name=Subquery(newest.values("node__name")[:1]))[
        :limit
    ]


def image_refusal(pool, image: str) -> str | None:
    """Why `image` may not run in `pool`, or None when an allowed registry admits it."""
    registries = list(pool.registries.all())
    if not registries:
        return f"pool {pool.slug} allows no image registry"
    try:
        ref = parse_image_reference(image)
    except ValueError as exc:
        return str(exc)
    for registry in registries:
        if ref.is_under(registry.prefix):
            if registry.require_digest and not ref.digest:
                return f"images from {registry.prefix} must be pinned by digest (@sha256:…)"
            return None
    allowed = ", ".join(r.prefix for r in registries)
    return f"image is not from an allowed registry of pool {pool.slug} ({allowed})"
