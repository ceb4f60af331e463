"""What a job's lifecycle (jobs/signals.py), the ledger (leases/signals.py) and a node's events
(nodes/signals.py) mean to the control loop, connected in SchedulingConfig.ready(); each runs
inside the sender's transaction."""

from functools import partial

from django.conf import settings
from django.db import transaction
from django.dispatch import receiver

from jobs.signals import job_cancelled, jobs_submitted
from leases.signals import capacity_returned
from nodes.signals import node_ready, node_returned
from scheduling import preemption
from scheduling.tasks import request_pass


@receiver(job_cancelled)
def call_off_preemption_of_cancelled_job(sender, job, actor, **kwargs):
    """A cancelled job's pending preemption is called off at once: its victims are spared."""
    preemption.call_off_for_cancelled(job)


def _pass_once_committed(pool_id: int) -> None:
    """A pass of the pool is asked for once the sender's transaction commits (it then sees what
    the transaction wrote); `request_pass` coalesces the requests (scheduling/coalesce.py)."""
    if settings.SCHEDULER_EVENT_PASSES:
        transaction.on_commit(partial(request_pass, pool_id), robust=True)


@receiver(jobs_submitted, dispatch_uid="scheduling.pass_for_submitted_jobs")
def pass_for_submitted_jobs(sender, pool_id, **kwargs):
    """Jobs were queued: a pass places them."""
    _pass_once_committed(pool_id)


@receiver(capacity_returned, dispatch_uid="scheduling.pass_for_returned_capacity")
def pass_for_returned_capacity(sender, lease, **kwargs):
    """A lease ended: its capacity may place a waiting job."""
    _pass_once_committed(lease.pool_id)


@receiver(node_ready, dispatch_uid="scheduling.pass_for_ready_node")
@receiver(node_returned, dispatch_uid="scheduling.pass_for_returned_node")
def pass_for_schedulable_node(sender, node, **kwargs):
    """A node became ready, or heartbeats again after its silence: its capacity is there."""
    _pass_once_committed(node.pool_id)
