from django.db.models import OuterRef, Subquery

from leases.models import Lease
from leases.services import explain_request
from pools.images import ImageRef

from .choices import JobState
from .models import Job


def jobs_visible_to(actor):
    return Job.objects.visible_to(actor).select_related("tenant", "pool", "shape", "priority_class")


def jobs_for_console(actor, limit: int = 100):
    """With the node of each job's newest lease, so people see where their work landed."""
    newest = Lease.objects.filter(job=OuterRef("pk")).order_by("-created_at", "-id")
    return jobs_visible_to(actor).annotate(node_name=Subquery(newest.values("node__name")[:1]))[
        :limit
    ]


def image_refusal(pool, ref: ImageRef) -> str | None:
    """Why the image `ref` may not run in `pool` (not from one of its allowed registries), or
    None. A tag is admitted even where the registry asks for digests: jobs/images.py resolves it
    to the digest at submit, and the job only ever stores and runs that."""
    registries = list(pool.registries.all())
    if not registries:
        return f"pool {pool.slug} allows no image registry"
    if any(ref.is_under(registry.prefix) for registry in registries):
        return None
    allowed = ", ".join(r.prefix for r in registries)
    return f"image is not from an allowed registry of pool {pool.slug} ({allowed})"


def job_explanation(job: Job, *, now: bool = True) -> dict:
    """ "Why is this pending" and "why did it land there", in one answer: a queued job's reason
    from the last pass and what the scheduler would say now; a placed job's decision record
    (the lease's placement: node, score breakdown, policy version). `now=False`: without the
    scheduler's answer now (a placement search, rate-limited)."""
    answer = {"job": job.pk, "state": job.state, "pending_reason": job.pending_reason or None}
    if job.state == JobState.QUEUED and not now:  # the last pass's reason only: no search
        return answer
    if job.state == JobState.QUEUED:
        answer["now"] = explain_request(
            pool=job.pool,
            tenant=job.tenant,
            request=job.resources,
            image_platforms=job.image_platforms,
        )
        return answer
    lease = job.leases.order_by("-created_at", "-id").first()
    answer["placement"] = None if lease is None else {"lease": lease.pk, **lease.placement}
    return answer
