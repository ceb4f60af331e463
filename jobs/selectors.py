from django.db.models import OuterRef, Subquery

from leases.models import Lease
from leases.services import explain_request
from nodes.models import GpuDevice
from pools.images import ImageRef

from . import trace
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


# When the scheduler's answer now says "it fits" but the last pass did not place the job, the
# queue holds the room for a reason a placement search does not see: which one, by the last
# pass's code. Any other code (no capacity, no ready node, a plan conflict …): capacity freed
# since that pass, and the next one places it.
HELD_BY_THE_QUEUE = {
    "backfill_would_delay_head": "but the queue holds it for the job ahead (above)",
    "short_share_reserved": "but that room is the pool's share for short jobs",
    "quota_exceeded": "but its tenant's quota has no room for it",
    "credit_exhausted": "but its tenant's credit is used up",
    "gang_incomplete": "but its gang is placed whole, once all its members are queued",
    "gang_mismatch": "but its gang's members must ask alike before any is placed",
    "preempting": "and it waits for the work it preempted to checkpoint",
}


def job_explanation(job: Job, *, now: bool = True) -> dict:
    """ "Why is this pending" and "why did it land there", in one answer: a queued job's reason
    from the last pass and what the scheduler would say now — with `differs` saying why the two
    disagree when they do —; a placed job's decision record (the lease's placement: node, score
    breakdown, policy version). `now=False`: without the scheduler's answer now (a placement
    search, rate-limited). A job named into a live reservation is not searched for: it runs
    there, when its window opens."""
    answer = {"job": job.pk, "state": job.state, "pending_reason": job.pending_reason or None}
    if job.state == JobState.QUEUED and not now:  # the last pass's reason only: no search
        return answer
    if job.state == JobState.QUEUED:
        reservation = job.reservation
        if reservation is not None and reservation.state == "reserved":
            answer["reservation"] = {
                "lease": reservation.pk,
                "window_start": reservation.window_start.isoformat(),
            }
            return answer
        answer["now"] = explain_request(
            pool=job.pool,
            tenant=job.tenant,
            request=job.resources,
            image_platforms=job.image_platforms,
        )
        code = (job.pending_reason or {}).get("code", "")
        if answer["now"].get("fits_now") and code:
            checked = job.pending_checked_at
            at = f" at {checked:%H:%M:%S}" if checked else ""
            answer["differs"] = HELD_BY_THE_QUEUE.get(
                code, f"capacity freed since the last pass{at}: it starts at the next pass"
            )
        return answer
    lease = job.leases.order_by("-created_at", "-id").first()
    answer["placement"] = None if lease is None else {"lease": lease.pk, **lease.placement}
    return answer


TRACE_EVENTS_MAX = 5000


def job_trace_spans(job: Job) -> list[trace.Span]:
    """The job's spans (jobs/trace.py) from its stored events; the devices of its leases for the
    operators' attributes."""
    events = list(
        job.events.order_by("at", "id").only(
            "id", "at", "from_state", "to_state", "reason", "data"
        )[:TRACE_EVENTS_MAX]
    )
    devices = {}
    leases = list(Lease.objects.filter(job=job).values_list("pk", "gpu_allocations"))
    gpu_ids = {a.get("gpu") for _, allocations in leases for a in allocations or ()}
    if gpu_ids:
        devices = dict(GpuDevice.objects.filter(pk__in=gpu_ids).values_list("pk", "uuid"))
    lease_gpus = {
        pk: {"gpus": [devices.get(a.get("gpu"), a.get("gpu")) for a in allocations or ()]}
        for pk, allocations in leases
    }
    return trace.job_spans(job, events, lease_gpus)


def job_trace(job: Job, actor) -> dict:
    """`GET /jobs/{id}/trace`: the spans in order; operators also see where each step ran
    (node, devices, lease, policy version)."""
    infrastructure = actor.is_operator
    return {
        "job": job.pk,
        "trace_id": job.trace_id,
        "traceparent": trace.job_traceparent(job),
        "spans": [
            trace.span_dict(span, infrastructure=infrastructure) for span in job_trace_spans(job)
        ],
    }
