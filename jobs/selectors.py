from .models import Job


def jobs_visible_to(user):
    return Job.objects.visible_to(user).select_related("tenant", "pool", "shape", "priority_class")


def image_refusal(pool, image: str) -> str | None:
    """Why `image` may not run in `pool`, or None when an allowed registry admits it."""
    registries = list(pool.registries.all())
    if not registries:
        return f"pool {pool.slug} allows no image registry"
    for registry in registries:
        if image.startswith(registry.prefix):
            if registry.require_digest and "@sha256:" not in image:
                return f"images from {registry.prefix} must be pinned by digest (@sha256:…)"
            return None
    allowed = ", ".join(r.prefix for r in registries)
    return f"image is not from an allowed registry of pool {pool.slug} ({allowed})"
