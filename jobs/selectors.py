from django.db.models import OuterRef, Subquery

from leases.models import Lease
from leases.services import explain_request
from nodes.models import GpuDevice
from pools.images import ImageRef
from storage.models import Volume

from . import retention, trace
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


# --- what is ephemeral, what persists (docs/storage.md) ------------------------------------


def _iso(value):
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def job_storage(job: Job, *, lease=None, retentions: dict | None = None) -> dict:
    """What of the job is gone when its attempt ends, what persists, until when, and where its
    outputs are fetched after its lease ended: one statement for the job's API answer, its
    lease's and its page, computed from the job's fields (output destination, volumes,
    output limit, scratch), its effective retention (jobs/retention.py) and its newest lease.
    `retentions` caches the effective retention per (tenant, pool) across a list."""
    if lease is None:
        cache = getattr(job, "_prefetched_objects_cache", {})
        leases = cache["leases"] if "leases" in cache else job.leases.order_by("-id")[:1]
        lease = max(leases, key=lambda held: held.pk, default=None)
    scratch = (job.resources or {}).get("scratch_mib") or 0
    ephemeral = ["container filesystem (removed with the container)"]
    if scratch:
        ephemeral.append(f"scratch ({scratch} MiB, deleted on the node when the attempt ends)")
    if job.inputs:
        ephemeral.append("inputs (fetched onto the node for each attempt, deleted when it ends)")
    limit = f"{job.output_limit_mib} MiB" if job.output_limit_mib else "no size limit"
    ephemeral.append(
        f"/outputs on the node ({limit}; uploaded when the attempt ends, then deleted there)"
    )
    key = (job.tenant_id, job.pool_id)
    if retentions is not None and key in retentions:
        kept = retentions[key]
    else:
        kept = retention.effective(job.tenant_id, job.pool)
        if retentions is not None:
            retentions[key] = kept
    outputs_api = f"/api/v1/jobs/{job.pk}/outputs/"
    if job.output_destination:
        outputs = {
            "what": "outputs",
            "where": job.output_destination,
            "until": None,  # the tenant's bucket keeps them as its own lifecycle says
            "encrypted": "server-side, by the object store",
            "fetch": job.output_destination,
            "listed": outputs_api,
        }
    else:
        outputs = {
            "what": "outputs",
            "where": "control plane",
            "until": _iso(retention.expires_at(job, kept)),
            "retention_days": kept.days,
            "retention_from": kept.source,
            "encrypted": "AES-256-GCM under the tenant's data key",
            "fetch": outputs_api,
        }
    persists = [outputs]
    mounts = [m for m in job.volumes or () if isinstance(m, dict)]
    ids = [m.get("volume") for m in mounts]
    volumes = {
        v.pk: v
        for v in Volume.objects.select_related("node").filter(
            pk__in=[i for i in ids if isinstance(i, int)]
        )
    }
    for mount in mounts:
        volume = volumes.get(mount.get("volume"))
        entry = {
            "what": f"volume {volume.name if volume else mount.get('volume')}",
            "volume": mount.get("volume"),
            "path": mount.get("path"),
            "read_only": bool(mount.get("read_only")),
        }
        if volume is not None:
            entry |= {
                "where": f"node {volume.node.name}",
                "until": _iso(volume.expires_at),
                "retention_days": volume.retention_days,
            }
        persists.append(entry)
    return {
        "ephemeral": ephemeral,
        "persists": persists,
        # the newest lease: when it ended, or (still held) when it expires unless renewed
        "lease": None
        if lease is None
        else {
            "id": lease.pk,
            "ended_at": _iso(lease.ended_at),
            "expires_at": _iso(lease.expires_at),
        },
    }
