"""A placed job's life on its node, driven by the worker agent (docs/data-plane.md): the steps it
reports (pulling, starting, running, the end) and what the retry policy does with a failed or
lost attempt. What the node should run (its assignments) is jobs/assignments.py's.

Every report is fenced: it names the fencing token of the lease it runs under, and only the
job's current holding lease on the reporting node is accepted (409 `fencing_token_mismatch`), so
a callback of an old attempt never touches a new one. The job's row lock orders reports.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Max, Min, Sum
from django.utils import timezone

from leases.choices import HOLDING, LeaseState
from leases.models import Lease
from leases.services import (
    lease_commit,
    lease_record_final_report,
    lease_set_route,
    lease_stopped,
)
from nodes.push import push_assignments
from nodes.services import node_image_pull_record
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .choices import TERMINAL, JobState
from .events import publish_job_event
from .models import Job, JobEvent, JobOutput
from .services import job_finish, job_release_leases, job_transition

S = JobState
# How an attempt may fail, as the agent reports it.
FAILURES = frozenset(
    {
        Reason.EXITED_NONZERO,
        Reason.OOM_KILLED,
        Reason.MAX_RUNTIME_EXCEEDED,
        Reason.STARTUP_TIMED_OUT,
        Reason.IMAGE_PULL_FAILED,
        Reason.IMAGE_INVALID,
        Reason.RUNTIME_ERROR,
        Reason.RUNTIME_UNAVAILABLE,
        Reason.MPS_UNAVAILABLE,
        Reason.GPU_MEMORY_SHARE_EXCEEDED,
        Reason.MIG_PROFILE_MISMATCH,  # the agent found another MIG instance at the slot
    }
)
STEPS = ("pulling", "starting", "running", "succeeded", "failed", "checkpointed", "stopped")
# The agent's last report of a run: the job's end, its checkpoint, or (for a cancelled job
# whose lease is stopping) the confirmation that its container has stopped.
END_STEPS = ("succeeded", "failed", "checkpointed", "stopped")
# The ends of a run after which the agent uploaded its log and outputs (`results_uploaded`)
RESULT_STEPS = ("succeeded", "failed", "checkpointed")
# Why the agent skipped a member of /outputs (worker_agent/outputs.py SKIP_REASONS)
OUTPUT_SKIP_REASONS = (
    "symlink",
    "hardlink",
    "fifo",
    "device",
    "directory",
    "other",
    "name",
    "reserved",
    "too_large",
    "too_many",
    "read_limit",
    "refused",
    "failed",
)
OUTPUTS_SKIPPED_MAX = 100
# After its lease ended, a node's last log lines and output files are still taken this long
# past the pool's stop grace (unless the agent's final report is already in): `lease_ended`.
CALLBACK_MARGIN = timedelta(seconds=30)


# --- reports ------------------------------------------------------------------------------


def _newest_lease(job: Job, node, fencing_token) -> Lease:
    """The job's newest lease (held or ended), if it is on `node` and carries the token. A job
    holds at most one lease at a time, and a new attempt's is newer than every earlier one."""
    lease = job.leases.order_by("-id").first()
    if lease is None or lease.node_id != node.pk or str(lease.fencing_token) != str(fencing_token):
        raise TransitionRefused(
            "fencing_token_mismatch",
            f"Stale fencing token: job {job.pk}'s newest lease is not that one on this node.",
        )
    return lease


def fenced_lease(job: Job, node, fencing_token) -> Lease:
    """The job's current holding lease, if it is on `node` and carries `fencing_token`; a
    report under it once it ended is refused `lease_ended`."""
    lease = _newest_lease(job, node, fencing_token)
    if lease.state not in HOLDING:
        raise TransitionRefused(
            "lease_ended", f"Lease {lease.pk} of job {job.pk} is {lease.state}: nothing to report."
        )
    return lease


def upload_lease(job: Job, node, fencing_token, now=None) -> Lease:
    """Logs and outputs may arrive after the end (the lease released then): they are accepted
    under the job's newest lease, held or ended, when it is this node's and carries the token,
    until the agent's final report under it is in or `stop_grace_s` + CALLBACK_MARGIN have
    passed since it ended (then 409 `lease_ended`). An attempt placed since has a newer lease,
    so an old attempt's uploads never mix with a new one's."""
    now = now or timezone.now()
    lease = _newest_lease(job, node, fencing_token)
    if lease.final_report_at is not None:
        raise TransitionRefused(
            "lease_ended",
            f"Lease {lease.pk} of job {job.pk} ended with the agent's final report "
            f"at {lease.final_report_at:%H:%M:%S}: no more logs or outputs under it.",
        )
    if lease.state not in HOLDING:
        grace = timedelta(seconds=knobs_for(job.pool).stop_grace_s)
        ended = lease.ended_at or lease.state_changed_at
        if now >= ended + grace + CALLBACK_MARGIN:
            raise TransitionRefused(
                "lease_ended",
                f"Lease {lease.pk} of job {job.pk} ended at {ended:%H:%M:%S}, longer ago than "
                f"the stop grace and {CALLBACK_MARGIN.seconds} s: no more logs or outputs.",
            )
    return lease


def job_report(
    *,
    job: Job,
    node,
    fencing_token,
    step: str,
    actor: Actor,
    reason: str = "",
    exit_code: int | None = None,
    message: str = "",
    route: dict | None = None,
    pull_seconds: float | None = None,
    outputs_skipped: list | None = None,
    outputs_skipped_total: int | None = None,
    upload_seconds: float | None = None,
    now=None,
) -> Job:
    """One step the agent reports. Raises TransitionRefused (409) when the token is stale or
    the step is not allowed from the job's state; a repeated step (the agent retrying after a
    lost answer) returns the job unchanged."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        lease = fenced_lease(job, node, fencing_token)
        if outputs_skipped and step in END_STEPS and job.state not in TERMINAL:
            _outputs_skipped(job, actor, outputs_skipped, outputs_skipped_total, now)
        if step in RESULT_STEPS and job.state not in TERMINAL and lease.state in HOLDING:
            _results_uploaded(job, actor, upload_seconds, now)
        if step in END_STEPS:  # written with the report's own changes, or not at all
            lease_record_final_report(lease=lease, now=now)
        if lease.state == LeaseState.STOPPING:
            return _stopping_report(job, lease, node, step, actor, message, now)
        if step == "pulling":
            job = _pulling(job, actor, reason, message, pull_seconds, now)
            if pull_seconds is not None:  # per image on the node (docs/nodes.md)
                node_image_pull_record(node=node, image=job.image, seconds=pull_seconds)
            return job
        if step == "starting":
            if job.state == S.STARTING:
                return job
            lease_commit(lease=lease, fencing_token=fencing_token, actor=actor, now=now)
            return job_transition(
                job=job,
                to=S.STARTING,
                actor=actor,
                reason=Reason.STARTUP_BEGAN,
                message=message or f"starting on {node.name}",
                now=now,
                data={"lease": lease.pk},
            )
        if step == "running":
            if job.state == S.RUNNING:
                return job
            route = route or {}
            job = job_transition(
                job=job,
                to=S.RUNNING,
                actor=actor,
                reason=Reason.CONTAINER_STARTED,
                message=message or f"running on {node.name}",
                now=now,
                changes={"route": route},
                data={"route": route} if route else None,
            )
            lease_set_route(lease=lease, route=route)
            return job
        if step == "succeeded":
            return job_finish(job=job, actor=actor, exit_code=0, message=message, now=now)
        if step == "failed":
            return job_attempt_failed(
                job=job, actor=actor, failure=reason, exit_code=exit_code, message=message, now=now
            )
        if step == "stopped":
            raise TransitionRefused(
                "transition_not_allowed",
                f"job {job.pk} is {job.state}: `stopped` confirms the stop of a cancelled job",
            )
        if step == "checkpointed":
            if job.state != S.CHECKPOINTING:  # only a requested checkpoint re-queues a job
                raise TransitionRefused(
                    "transition_not_allowed", f"job {job.pk} is {job.state}, not checkpointing"
                )
            job = job_transition(
                job=job,
                to=S.QUEUED,
                actor=actor,
                reason=Reason.CHECKPOINT_DONE,
                message=message or f"checkpoint written on {node.name}; re-queued",
                now=now,
            )
            job_release_leases(job=job, actor=actor, message="checkpoint written", now=now)
            return job
    raise ValueError(f"unknown step {step!r}")


def _stopping_report(job: Job, lease: Lease, node, step: str, actor: Actor, message, now) -> Job:
    """A report under a stopping lease (its job was cancelled). Any end of the run confirms
    the container stopped: the lease is released, its capacity back. An earlier step (the
    agent had not seen the cancel yet) changes nothing, so the agent goes on to stop it."""
    if step in END_STEPS:
        lease_stopped(
            lease=lease,
            actor=actor,
            message=message or f"{step} on {node.name}: the container has stopped",
            now=now,
        )
    return job


def job_request_checkpoint(
    *, job: Job, actor: Actor, reason: str, message: str, now=None, data=None
) -> Job:
    """Ask a running checkpointable job to checkpoint (running → checkpointing): a drain at its
    deadline and a preemption both do. The node's agent reads it in its assignment
    (`checkpoint_requested`), signals the job, stops it after the pool's `stop_grace_s`,
    uploads the checkpoint and reports `checkpointed`: the job is queued again and its lease
    released. An agent that never reports loses the lease with its node, and the stranded-jobs
    sweep makes the job `lost` or retries it (scheduling.passes.requeue_jobs_without_lease).
    The node is nudged once this commits (nodes/push.py), so its agent reads it at once."""
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=S.CHECKPOINTING,
            actor=actor,
            reason=reason,
            message=message,
            now=now,
            data=data,
            check=_checkpointable,
        )
        push_assignments(
            list(job.leases.filter(state__in=HOLDING).values_list("node_id", flat=True))
        )
    return job


def _checkpointable(job: Job) -> None:
    if not job.checkpointable:  # stateful work that cannot checkpoint is never asked to
        raise TransitionRefused("not_checkpointable", f"job {job.pk} is not checkpointable")


def _outputs_skipped(job: Job, actor: Actor, skipped: list, total: int | None, now) -> None:
    """What the agent did not upload of what the job left in /outputs, and why (an event,
    state unchanged; docs/data-plane.md "Outputs and checkpoints")."""
    total = max(total or 0, len(skipped))
    listed = ", ".join(f"{entry['name']} ({entry['reason']})" for entry in skipped[:5])
    more = f" and {total - 5} more" if total > 5 else ""
    event = JobEvent.record(
        job,
        actor=actor,
        from_state=job.state,
        to_state=job.state,
        reason=Reason.OUTPUTS_SKIPPED,
        message=f"{total} output(s) not uploaded: {listed}{more}"[:1000],
        at=now,
        data={"skipped": skipped, "total": total},
    )
    transaction.on_commit(lambda: publish_job_event(job, event))


def _results_uploaded(job: Job, actor: Actor, upload_seconds: float | None, now) -> None:
    """The attempt's results are in (docs/observability.md "Traces"): a `results_uploaded`
    event, written with the final report, at the time the upload began — the container's exit,
    `upload_seconds` before the report — or, from an agent that does not say, the attempt's
    first stored output; none when neither is known. Never before the job's previous event."""
    outputs = JobOutput.objects.filter(job=job, attempt=job.attempts).aggregate(
        files=Count("id"), bytes=Sum("size"), first=Min("created_at")
    )
    if upload_seconds is not None:
        began = now - timedelta(seconds=upload_seconds)
    elif outputs["first"] is not None:
        began = min(outputs["first"], now)
    else:
        return
    previous = job.events.aggregate(at=Max("at"))["at"]
    began = max(began, previous) if previous is not None else began
    seconds = (now - began).total_seconds()
    event = JobEvent.record(
        job,
        actor=actor,
        from_state=job.state,
        to_state=job.state,
        reason=Reason.RESULTS_UPLOADED,
        message=f"{outputs['files']} output(s) uploaded with the log in {seconds:.1f} s",
        at=began,
        data={
            "attempt": job.attempts,
            "files": outputs["files"],
            "bytes": outputs["bytes"] or 0,
            "upload_seconds": round(seconds, 3),
        },
    )
    transaction.on_commit(lambda: publish_job_event(job, event))


def _pulling(job: Job, actor: Actor, reason, message, pull_seconds, now) -> Job:
    """An event on the job, no state change (`image_pulled` with the measured pull time)."""
    if job.state not in (S.LEASED, S.STARTING):
        raise TransitionRefused("transition_not_allowed", f"job {job.pk} is {job.state}")
    pulled = reason == Reason.IMAGE_PULLED or pull_seconds is not None
    event = JobEvent.record(
        job,
        actor=actor,
        from_state=job.state,
        to_state=job.state,
        reason=Reason.IMAGE_PULLED if pulled else Reason.IMAGE_PULLING,
        message=message or ("image pulled" if pulled else f"pulling {job.image}"),
        at=now,
        data={"pull_seconds": pull_seconds} if pull_seconds is not None else None,
    )
    transaction.on_commit(lambda: publish_job_event(job, event))
    return job


# --- the end of an attempt and the retry policy --------------------------------------------


def retry_allowed(job: Job, failure: str) -> bool:
    """The job's retry policy retries this failure and the attempts are not used up."""
    policy = job.retry_policy or {}
    return job.attempts < int(policy.get("max_attempts") or 1) and failure in (
        policy.get("retry_on") or ()
    )


def job_attempt_failed(
    *, job: Job, actor: Actor, failure: str, exit_code=None, message: str = "", now=None
) -> Job:
    """The attempt failed with `failure` (a reason of FAILURES): the job fails, or goes back to
    the queue when its retry policy says so. Its leases are released either way."""
    if failure not in FAILURES:
        raise ValueError(f"not a failure reason: {failure!r}")
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if retry_allowed(job, failure):
            return job_retry(
                job=job, actor=actor, failure=failure, exit_code=exit_code, message=message, now=now
            )
        return job_finish(
            job=job, actor=actor, exit_code=exit_code, reason=failure, message=message, now=now
        )


def job_retry(
    *, job: Job, actor: Actor, failure: str, exit_code=None, message: str = "", now=None, check=None
) -> Job:
    """Back to the queue, not before now + the policy's backoff (`retry_scheduled`, the failure
    in the event's data); the attempt's leases are released in the same transaction."""
    now = now or timezone.now()
    backoff = int((job.retry_policy or {}).get("backoff_s") or 0)
    not_before = now + timedelta(seconds=backoff)
    max_attempts = int((job.retry_policy or {}).get("max_attempts") or 1)
    with transaction.atomic():
        job = job_transition(
            job=job,
            to=S.QUEUED,
            actor=actor,
            reason=Reason.RETRY_SCHEDULED,
            message=(message or failure)
            + f"; retry {job.attempts + 1} of {max_attempts} not before {not_before:%H:%M:%S}",
            now=now,
            check=check,
            changes={"exit_code": exit_code, "not_before": not_before, "pending_reason": {}},
            data={
                "failure": failure,
                "exit_code": exit_code,
                "attempt": job.attempts,
                "not_before": not_before.isoformat(),
            },
        )
        job_release_leases(job=job, actor=actor, message=f"attempt failed: {failure}", now=now)
    return job


def job_lost(*, job: Job, actor: Actor, message: str = "", now=None, check=None) -> Job:
    """The job's node went silent and its lease ended: `lost` (`node_lost`), or queued again
    when its retry policy retries `node_lost`."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        message = message or "its node went silent and its lease ended"
        if retry_allowed(job, Reason.NODE_LOST):
            return job_retry(
                job=job,
                actor=actor,
                failure=Reason.NODE_LOST,
                message=message,
                now=now,
                check=check,
            )
        job = job_transition(
            job=job,
            to=S.LOST,
            actor=actor,
            reason=Reason.NODE_LOST,
            message=message,
            now=now,
            check=check,
        )
        job_release_leases(job=job, actor=actor, message="job lost", now=now)
    return job


def job_capacity_vanished(
    *, job: Job, actor: Actor, message: str, data=None, now=None, lease=None
) -> Job:
    """Its node's reported capacity shrank under it (jobs/receivers.py): the lease the job holds
    there ends with `capacity_vanished`, and the job (docs/observability.md "Traces"):
    - placed but not started (leased): back to the queue, as a lease that expired before start;
    - started (starting, running, checkpointing): the attempt failed with `capacity_vanished`:
      queued again when its retry policy retries `capacity_vanished` and attempts are left,
      otherwise failed. Its container is stopped by the agent once the lease is gone.
    `lease`: the lease that lost its capacity; the job is left alone unless that lease still
    holds (decided without locks, the job may have ended or moved since)."""
    now = now or timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state not in (S.LEASED, S.STARTING, S.RUNNING, S.CHECKPOINTING):
            return job
        if lease is not None and not job.leases.filter(pk=lease.pk, state__in=HOLDING).exists():
            return job
        if job.state == S.LEASED or retry_allowed(job, Reason.CAPACITY_VANISHED):
            changes = {"pending_reason": {}}
            if job.state != S.LEASED:
                backoff = int((job.retry_policy or {}).get("backoff_s") or 0)
                changes["not_before"] = now + timedelta(seconds=backoff)
            job = job_transition(
                job=job,
                to=S.QUEUED,
                actor=actor,
                reason=Reason.CAPACITY_VANISHED,
                message=message,
                now=now,
                changes=changes,
                data={**(data or {}), "failure": Reason.CAPACITY_VANISHED, "attempt": job.attempts},
            )
        else:
            job = job_transition(
                job=job,
                to=S.FAILED,
                actor=actor,
                reason=Reason.CAPACITY_VANISHED,
                message=message,
                now=now,
                data={**(data or {}), "attempt": job.attempts},
            )
        job_release_leases(job=job, actor=actor, message=f"capacity vanished: {message}", now=now)
    return job
