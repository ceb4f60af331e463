import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from pools.choices import PlatformRole
from pools.statemachine import EventBase
from pools.visibility import Visibility, VisibleQuerySet

from .choices import TERMINAL, AntiAffinityScope, JobState


def default_network_policy():
    return {"mode": "none", "egress_allow": []}


def new_trace_id() -> str:
    """A random W3C trace id (32 lowercase hex, never all zeros)."""
    return secrets.token_hex(16)


def default_retry_policy():
    return {"max_attempts": 1, "backoff_s": 30, "retry_on": ["node_lost"]}


class Job(models.Model):
    objects = VisibleQuerySet.as_manager()
    # a node's agent sees the jobs that hold (or held) a lease on its node
    visibility = Visibility(tenant="tenant", node="leases__node")

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="jobs")
    # indexed by (pool, state, created_at) below: a pool-only index would be one more to write
    pool = models.ForeignKey(
        "pools.ComputePool", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    name = models.CharField(max_length=100)
    shape = models.ForeignKey(
        "pools.ResourceShape", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resources = models.JSONField(help_text="The resolved resource request (shape fields)")
    # `image` is the pinned digest reference the agent runs; `image_requested` what was submitted
    image = models.CharField(max_length=300)
    image_requested = models.CharField(max_length=300, blank=True)
    # the platforms the registry says the digest is built for (["linux/amd64"]), resolved at
    # submit: the scheduler places the job only on nodes of one of these architectures
    image_platforms = models.JSONField(default=list, blank=True)
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    priority_class = models.ForeignKey(
        "pools.PriorityClass", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    checkpointable = models.BooleanField(default=False)
    max_runtime_s = models.PositiveIntegerField(default=3600)
    # {ENV_NAME: secret name} of the tenant's secrets: names only, values resolved at assignment
    secrets = models.JSONField(default=dict, blank=True)
    inputs = models.JSONField(default=list, blank=True, help_text='[{"url", "name"}]')
    ports = models.JSONField(default=list, blank=True)
    network_policy = models.JSONField(default=default_network_policy, blank=True)
    retry_policy = models.JSONField(default=default_retry_policy, blank=True)
    # "" = the control plane's artifact storage (Django's default storage); "s3://bucket/prefix/"
    # a bucket the tenant registered (pools.TenantBucket), uploaded by presigned PUTs
    output_destination = models.CharField(max_length=300, blank=True)
    # the tenant's persistent volumes the job mounts (docs/storage.md):
    # [{"volume": <id>, "path": "/data", "read_only": false}]
    volumes = models.JSONField(default=list, blank=True)
    # /outputs is a filesystem of this size on the node, counted as the job's disk there
    # (with scratch); 0: no limit (only the process runtime runs such a job)
    output_limit_mib = models.PositiveIntegerField(default=0)
    # Placement (docs/scheduler.md "Labels and affinity"): the job's own labels (other jobs'
    # anti-affinity sees them on its node), node labels it requires, workload labels it avoids,
    # and whether its CPU and memory must come from one NUMA node. Also carried in `resources`,
    # the request the scheduling pass reserves with.
    labels = models.JSONField(default=dict, blank=True)
    affinity = models.JSONField(default=dict, blank=True)
    affinity_preferred = models.JSONField(default=dict, blank=True)
    anti_affinity = models.JSONField(default=dict, blank=True)
    # where anti-affinity looks for work with those labels: the node ("host") or every node of
    # the node's zone ("zone"), for replicas of one service spread across hosts or zones
    anti_affinity_scope = models.CharField(
        max_length=4, choices=AntiAffinityScope.choices, default=AntiAffinityScope.HOST
    )
    require_numa = models.BooleanField(default=False)
    # {"name", "size", "topology"} (docs/scheduler.md "Gangs of jobs"): the tenant's queued jobs
    # of the pool that share the name are placed together, all or none; {} = not in a gang
    gang = models.JSONField(default=dict, blank=True)
    # A reservation of the job's tenant in its pool (a lease made with a window): the job is
    # placed into it when the window opens and runs on that lease (docs/leases.md).
    reservation = models.ForeignKey(
        "leases.Lease",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="reserved_jobs",
        db_index=False,  # a partial index below: the few jobs that name one, nothing for the rest
    )
    # where a running job with ports answers: {"host": …, "ports": {"8080": 32768}}
    route = models.JSONField(default=dict, blank=True)
    # retry backoff: the scheduling pass leaves a queued job alone until then
    not_before = models.DateTimeField(null=True, blank=True)
    state = models.CharField(
        max_length=14, choices=JobState.choices, default=JobState.QUEUED
    )  # indexed below, without the pattern-ops copy Django adds to an indexed CharField
    state_changed_at = models.DateTimeField(default=timezone.now)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    # Why a queued job is not placed yet: the scheduler's latest explanation (counts per reason,
    # nearest miss). Cleared when it is placed.
    pending_reason = models.JSONField(default=dict, blank=True)
    pending_checked_at = models.DateTimeField(null=True, blank=True)
    # While queued: its queue class and predicted start window (scheduling/forecast.py),
    # {"queue_class", "earliest", "latest", "updated_at"}; nothing about other tenants' work.
    forecast = models.JSONField(default=dict, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    # POST /jobs with `Idempotency-Key`: a retry with the same key and body gets this job back
    idempotency_key = models.CharField(max_length=100, blank=True, default="")
    idempotency_digest = models.CharField(max_length=64, blank=True, default="")

    # One trace per job (docs/observability.md "Traces"): a W3C trace id, the client's own
    # when its submit carried a valid `traceparent` (then its span is the parent, else "")
    trace_id = models.CharField(max_length=32, default=new_trace_id)
    parent_span_id = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["pool", "state", "created_at"]),
            models.Index(fields=["state"], name="jobs_job_state"),
            models.Index(
                fields=["reservation"],
                condition=models.Q(reservation__isnull=False),
                name="jobs_job_names_reservation",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="one_job_per_tenant_idempotency_key",
            )
        ]

    def __str__(self):
        return f"job {self.pk} {self.name}"

    @property
    def has_ended(self) -> bool:
        """Ended for good (succeeded, failed, cancelled, lost): its lease is not renewed."""
        return self.state in TERMINAL


class JobEvent(EventBase):
    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="job__tenant", node="job__leases__node")
    subject_field = "job"
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")

    class Meta(EventBase.Meta):
        pass


class JobLogChunk(models.Model):
    """A piece of a job's log as the agent sent it; only the newest 10 MiB per job are kept."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="job__tenant", node="job__leases__node")

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveSmallIntegerField()
    seq = models.PositiveIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "seq"]
        indexes = [models.Index(fields=["job", "seq"])]

    def __str__(self):
        return f"log of job {self.job_id} #{self.seq}"


def output_upload_to(instance: "JobOutput", filename: str) -> str:
    """A key of its own per stored file, never the output's name: a name is up to 255
    characters (more bytes than one path component may have), and the storage's suffix for a
    name already taken would make it longer still. The name lives in the row."""
    return f"outputs/{instance.job_id}/{instance.attempt}/{uuid.uuid4().hex}"


class JobOutput(models.Model):
    """A file the job wrote to /outputs, stored through Django's storage API."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="job__tenant", node="job__leases__node")

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="outputs")
    attempt = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=255)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    file = models.FileField(upload_to=output_upload_to, max_length=400, blank=True)
    # where the output lives when it is not in the control plane's storage: "s3://bucket/key"
    # of the job's output destination ("" = `file`)
    location = models.CharField(max_length=1100, blank=True, default="")
    # the tenant's data key `file` is sealed under (jobs/encryption_at_rest.py); NULL: stored
    # as it came (an output stored before outputs were encrypted, or one in `location`)
    data_key = models.ForeignKey(
        "TenantDataKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "attempt", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "name"], name="job_output_unique_name_per_attempt"
            )
        ]

    def __str__(self):
        return f"output {self.name} of job {self.job_id} (attempt {self.attempt})"


class TenantDataKey(models.Model):
    """A tenant's 256-bit data key for its outputs at rest (jobs/encryption_at_rest.py), kept
    wrapped: sealed by the key ring (pools/encryption.py) under `key_id`. One active key per
    tenant seals new outputs; every key stays while an output names it."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility()  # operators only; no API shows it

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="data_keys")
    key_id = models.CharField(max_length=32, help_text="The key ring's key that wraps it")
    wrapped = models.BinaryField(help_text="nonce || AES-256-GCM(data key) under key_id")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    rewrapped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"],
                condition=models.Q(active=True),
                name="tenant_data_key_one_active",
            )
        ]

    def __str__(self):
        return f"data key {self.pk} of tenant {self.tenant_id}"


class TenantRetention(models.Model):
    """How long a tenant's outputs and logs are kept after its jobs end: in one pool, or (pool
    NULL) in every pool without a row of its own; without a row, the pool's
    `output_retention_days` knob (jobs/retention.py)."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(tenant="tenant", seen_by=(PlatformRole.POLICY_ADMIN,))

    tenant = models.ForeignKey(
        "pools.Tenant", on_delete=models.CASCADE, related_name="output_retentions"
    )
    pool = models.ForeignKey(
        "pools.ComputePool",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Empty: every pool without a row of its own",
    )
    output_retention_days = models.PositiveIntegerField()
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["tenant", "pool"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "pool"], name="tenant_retention_one_per_pool"
            ),
            models.UniqueConstraint(
                fields=["tenant"],
                condition=models.Q(pool__isnull=True),
                name="tenant_retention_one_for_all_pools",
            ),
        ]

    def __str__(self):
        where = f"pool {self.pool_id}" if self.pool_id else "every pool"
        return f"tenant {self.tenant_id}: {self.output_retention_days} days in {where}"
