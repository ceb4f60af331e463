from django.db import models

from pools.choices import PlatformRole
from pools.visibility import Visibility, VisibleQuerySet


class TenantUsage(models.Model):
    """Fair share's memory of a tenant's past use of a pool (scheduling/fairshare.py): resource-
    seconds held, every second weighted by 2^-(its age / the pool's half-life), as of
    `updated_at` (decay it to read it now). Written only by `fairshare.charge`."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant", seen_by=(PlatformRole.POLICY_ADMIN,))

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("pools.ComputePool", on_delete=models.CASCADE, related_name="+")
    cpu_millicore_s = models.FloatField(default=0.0)
    memory_mib_s = models.FloatField(default=0.0)
    gpu_s = models.FloatField(default=0.0)
    updated_at = models.DateTimeField()
    # the latest charge's failure on this row ("" once a charge succeeds): the others went on
    charge_error = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="one_usage_per_tenant_pool")
        ]

    def __str__(self):
        return f"usage of tenant {self.tenant_id} in pool {self.pool_id}"

    @property
    def usage_s(self) -> tuple[float, float, float]:
        return (self.cpu_millicore_s, self.memory_mib_s, self.gpu_s)


class PassRecord(models.Model):
    """One scheduling pass over one pool, for the operators' scheduler-health page
    (scheduling/health.py `record_pass`); rows older than SCHEDULER_HEALTH_WINDOW are pruned."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    pool = models.ForeignKey("pools.ComputePool", on_delete=models.CASCADE, related_name="+")
    started_at = models.DateTimeField()
    duration_s = models.FloatField()
    considered = models.PositiveIntegerField(default=0)  # queued jobs in the pass's window
    placed = models.PositiveIntegerField(default=0)
    conflicts = models.PositiveIntegerField(default=0)  # plan_conflict: a node taken meanwhile
    errors = models.PositiveIntegerField(default=0)  # scheduling_error on a job
    # the batch plan's phases (null: the single path placed this pass's jobs)
    snapshot_s = models.FloatField(null=True, blank=True)  # read the window, snapshot the pool
    plan_s = models.FloatField(null=True, blank=True)  # plan in the pure core
    apply_s = models.FloatField(null=True, blank=True)  # the transaction that writes the plan

    class Meta:
        indexes = [models.Index(fields=["pool", "started_at"])]

    def __str__(self):
        return f"pass of pool {self.pool_id} at {self.started_at:%H:%M:%S}"


class CapacitySample(models.Model):
    """A pool's capacity totals at one moment (leases.selectors.pool_capacity: allocatable,
    reserved = requested, used = measured, …), taken by `health.sample_capacity` for the
    utilisation-over-time charts; `error` says why a sample could not be taken."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    pool = models.ForeignKey("pools.ComputePool", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    totals = models.JSONField(default=dict, blank=True)
    # each node's part, for its page's usage graph: {name: {"reserved": [cpu m, MiB, GPU ‰],
    # "used": [...], "allocatable": [...]}}
    nodes = models.JSONField(default=dict, blank=True)
    # the pool's queued jobs then, by pending reason code: the queue depth chart and the
    # idle-with-backlog condition over time (scheduling/conditions.py)
    queued = models.JSONField(default=dict, blank=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [models.Index(fields=["pool", "at"])]

    def __str__(self):
        return f"capacity of pool {self.pool_id} at {self.at:%H:%M:%S}"


class HealthRollup(models.Model):
    """One pool's hour, rolled up from its capacity samples and pass records
    (`health.roll_up`), kept `HEALTH_ROLLUP_DAYS` (30) while the raw rows keep
    SCHEDULER_HEALTH_WINDOW_HOURS: the 7-day charts read these. `capacity`: per dimension the
    mean and peak of requested and measured as a percent of schedulable, and the mean
    schedulable; `passes`: count, mean and max seconds, placed, considered, conflicts, errors.
    `error` says why the hour could not be rolled up (the other pools and hours went on)."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    pool = models.ForeignKey("pools.ComputePool", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    capacity = models.JSONField(default=dict, blank=True)
    passes = models.JSONField(default=dict, blank=True)
    samples = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=500, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "hour"], name="one_rollup_per_pool_hour")
        ]

    def __str__(self):
        return f"health of pool {self.pool_id} in the hour {self.hour:%Y-%m-%d %H:00}"


class PreemptionNotice(models.Model):
    """A preemption decided and not yet carried out (scheduling/preemption.py): the preemptor
    (one notice at most) waits the pool's `preemption_notice_s` from `decided_at`; a later pass
    then asks the victims to checkpoint, or calls it off. Deleted once confirmed or called off
    (the preemptor's events keep the story)."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    preemptor = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey("pools.ComputePool", on_delete=models.CASCADE, related_name="+")
    node = models.CharField(max_length=100)  # the node's name, where the victims run
    decided_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["pool", "decided_at"])]

    def __str__(self):
        return f"preemption for job {self.preemptor_id} on {self.node}"


class NoticedVictim(models.Model):
    """One victim of a pending `PreemptionNotice`, on the lease it held when chosen. A job is
    the victim of one pending notice at most (the database holds it), so two preemptors, even
    decided by two workers at once, never count on the same work."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only

    notice = models.ForeignKey(PreemptionNotice, on_delete=models.CASCADE, related_name="victims")
    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="+")
    lease = models.ForeignKey("leases.Lease", on_delete=models.CASCADE, related_name="+")

    def __str__(self):
        return f"victim {self.job_id} of {self.notice}"
