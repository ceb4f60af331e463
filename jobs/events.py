"""Live job events: after a transition commits, it is pushed to the job's Channels groups."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def job_group(job_id: int) -> str:
    return f"job-{job_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}"


def event_payload(job, event) -> dict:
    return {
        "job": job.pk,
        "name": job.name,
        "state": job.state,
        "at": event.at.isoformat(),
        "from": event.from_state,
        "to": event.to_state,
        "reason": event.reason,
        "message": event.message,
        "actor": event.actor_label,
    }


def publish_job_event(job, event) -> None:
    """Called on commit; a broken channel layer must never undo or fail the transition."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "job.event", "event": event_payload(job, event)}
    try:
        for group in (job_group(job.pk), tenant_group(job.tenant_id)):
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # the database is the source of truth; browsers can re-read it
        logger.warning("could not publish event of job %s", job.pk, exc_info=True)
