"""What a job's lifecycle means to the control loop (jobs/signals.py), connected in
SchedulingConfig.ready(); each runs inside the sender's transaction."""

from django.dispatch import receiver

from jobs.signals import job_cancelled
from scheduling import preemption


@receiver(job_cancelled)
def call_off_preemption_of_cancelled_job(sender, job, actor, **kwargs):
    """A cancelled job's pending preemption is called off at once: its victims are spared."""
    preemption.call_off_for_cancelled(job)
