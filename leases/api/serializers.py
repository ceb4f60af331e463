import re
import time

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from rest_framework import serializers

from leases.choices import HOLDING
from leases.models import Lease, LeaseEvent
from leases.services import SCHEDULER_KEY_PREFIX
from leases.signals import storage_statement
from pools.actors import Actor
from pools.api.serializers import KnownFieldsOnly, ResourceRequestSerializer, shape_or_resources
from pools.gpu_sharing import gpu_sharing_note
from pools.models import ComputePool, Tenant
from pools.validation import BIGINT_MAX

MAX_DURATION_S = 7 * 24 * 3600
USAGE_MAX = 2**31 - 1  # the usage columns are PostgreSQL integers
POOL_CACHE_SECONDS = 5.0
_POOLS: dict[str, tuple[float, ComputePool]] = {}


def cached_pool(slug: str) -> ComputePool | None:
    """Pools change rarely; a few seconds of caching per process saves a query per reserve."""
    now = time.monotonic()
    hit = _POOLS.get(slug)
    if hit and now - hit[0] < POOL_CACHE_SECONDS:
        return hit[1]
    pool = ComputePool.objects.filter(slug=slug).first()
    if pool is not None:
        _POOLS[slug] = (now, pool)
    return pool


@receiver([post_save, post_delete], sender=ComputePool)
def _forget_pool(sender, instance, **kwargs):
    _POOLS.pop(instance.slug, None)


class LeaseEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = LeaseEvent
        fields = ["at", "actor", "from_state", "to_state", "reason", "message", "data"]


class LeaseSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    node = serializers.SerializerMethodField()
    fencing_token = serializers.CharField(read_only=True, help_text="Send back on commit/renew")
    held = serializers.SerializerMethodField()
    consumed = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()
    storage = serializers.SerializerMethodField()
    gpu_sharing_note = serializers.SerializerMethodField()

    class Meta:
        model = Lease
        fields = [
            "id",
            "pool",
            "tenant",
            "node",
            "node_id",
            "job",
            "state",
            "state_changed_at",
            "cpu_millicores",
            "memory_mib",
            "scratch_mib",
            "gpu_allocations",
            "gpu_sharing_note",
            "request",
            "placement",
            "policy_version",
            "fencing_token",
            "expires_at",
            "committed_at",
            "ended_at",
            "window_start",
            "window_end",
            "tolerance_s",
            "backfill_of",
            "jobs",
            "held",
            "consumed",
            "idempotency_key",
            "created_at",
            "storage",
        ]
        read_only_fields = fields

    def to_representation(self, lease):
        return lease_representation(lease)

    def get_node(self, lease) -> str:
        # The placement record names the node: no query for the node row.
        return lease.placement.get("node") or lease.node.name

    def get_held(self, lease) -> dict:
        return _held(lease)

    def get_jobs(self, lease) -> list[int]:
        return reservation_jobs(lease)

    def get_consumed(self, lease) -> dict | None:
        return _consumed(lease)

    def get_storage(self, lease) -> dict:
        return lease_storage(lease)

    def get_gpu_sharing_note(self, lease) -> str:
        """What its GPUs isolate, in words ("" without GPUs; pools/gpu_sharing.py)."""
        return gpu_sharing_note(lease.request)


def _iso(value):
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _held(lease: Lease) -> dict:
    holding = lease.state in HOLDING
    return {
        "cpu_millicores": lease.cpu_millicores if holding else 0,
        "memory_mib": lease.memory_mib if holding else 0,
        "scratch_mib": lease.scratch_mib if holding else 0,
        "gpu_milli": lease.gpu_milli if holding else 0,
    }


def _consumed(lease: Lease) -> dict | None:
    if lease.usage_reported_at is None:
        return None
    return {
        "cpu_millicores": lease.used_cpu_millicores,
        "memory_mib": lease.used_memory_mib,
        "gpu_milli": lease.used_gpu_milli,
        "reported_at": _iso(lease.usage_reported_at),
    }


def lease_storage(lease: Lease) -> dict:
    """What of the lease's work is ephemeral and what persists (docs/storage.md): a job's lease
    answers with its job's statement (the jobs app, through `storage_statement`); a lease
    without a job holds only capacity, its scratch among it, until it ends (no query: the
    reserve's hot path)."""
    if lease.job_id is not None:
        for _, answer in storage_statement.send(sender=Lease, lease=lease):
            if answer is not None:
                return answer
    ephemeral = ["container filesystem (removed with the container)"]
    if lease.scratch_mib:
        ephemeral.append(
            f"scratch ({lease.scratch_mib} MiB of the node's disk, until the lease ends)"
        )
    return {
        "ephemeral": ephemeral,
        "persists": [],
        "lease": {
            "id": lease.pk,
            "ended_at": _iso(lease.ended_at),
            "expires_at": _iso(lease.expires_at),
        },
    }


def reservation_jobs(lease: Lease) -> list[int]:
    """The jobs that name this reservation (`reservation` on POST /jobs), oldest first; [] for a
    lease without a window (no query on the reserve hot path)."""
    if lease.window_start is None:
        return []
    return sorted(job.pk for job in lease.reserved_jobs.all())


def lease_representation(lease: Lease) -> dict:
    """LeaseSerializer's output, built directly: the hot path skips DRF's per-instance field
    construction (a few milliseconds per request)."""
    return {
        "id": lease.pk,
        "pool": lease.pool.slug,
        "tenant": lease.tenant.slug,
        "node": lease.placement.get("node") or lease.node.name,
        "node_id": lease.node_id,
        "job": lease.job_id,
        "state": lease.state,
        "state_changed_at": _iso(lease.state_changed_at),
        "cpu_millicores": lease.cpu_millicores,
        "memory_mib": lease.memory_mib,
        "scratch_mib": lease.scratch_mib,
        "gpu_allocations": lease.gpu_allocations,
        # what its GPUs isolate, in words (a time-slice share: no memory or compute isolation)
        "gpu_sharing_note": gpu_sharing_note(lease.request),
        "request": lease.request,
        "placement": lease.placement,
        "policy_version": lease.policy_version,
        "fencing_token": str(lease.fencing_token),
        "expires_at": _iso(lease.expires_at),
        "committed_at": _iso(lease.committed_at),
        "ended_at": _iso(lease.ended_at),
        "window_start": _iso(lease.window_start),
        "window_end": _iso(lease.window_end),
        "tolerance_s": lease.tolerance_s,
        "backfill_of": lease.backfill_of_id,
        "jobs": reservation_jobs(lease),
        "held": _held(lease),
        "consumed": _consumed(lease),
        "idempotency_key": lease.idempotency_key,
        "created_at": _iso(lease.created_at),
        "storage": lease_storage(lease),
    }


class WindowSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    tolerance_s = serializers.IntegerField(min_value=0, max_value=7 * 24 * 3600, default=300)

    def validate(self, attrs):
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "The window must end after it starts."})
        return attrs


class LeaseCreateSerializer(KnownFieldsOnly, serializers.Serializer):
    pool = serializers.SlugField()
    tenant = serializers.SlugField()
    shape = serializers.SlugField(required=False, help_text="A catalogue shape of the pool")
    resources = ResourceRequestSerializer(required=False, help_text="Or an inline shape")
    duration_s = serializers.IntegerField(min_value=1, max_value=MAX_DURATION_S, required=False)
    window = WindowSerializer(required=False)

    def validate_tenant(self, slug):
        actor = Actor.from_request(self.context["request"])
        tenant = Tenant.objects.visible_to(actor).filter(slug=slug).first()
        if tenant is not None and not (actor.is_operator or tenant.pk in actor.tenant_roles):
            tenant = None  # seeing a tenant (policy admins see all) is not reserving for it
        if tenant is None:
            # The same answer for "does not exist" and "not yours": tenants stay invisible.
            raise serializers.ValidationError("No tenant of yours has this slug.")
        return tenant

    def validate_pool(self, slug):
        pool = cached_pool(slug)
        if pool is None:
            raise serializers.ValidationError("No pool has this slug.")
        return pool

    def validate(self, attrs):
        _, attrs["request"] = shape_or_resources(attrs)
        if "duration_s" not in attrs:
            attrs["duration_s"] = int(settings.LEASE_DEFAULT_TTL.total_seconds())
        return attrs


# Visible ASCII, at most the column's length: a UUID, a ULID, base64 or a hash all fit.
IDEMPOTENCY_KEY = re.compile(r"[!-~]{1,100}")


def idempotency_key(request) -> str:
    """The `Idempotency-Key` header ("" when absent), or 400 with the header as the field: not
    visible ASCII of at most 100 characters, or in the scheduler's namespace."""
    key = request.headers.get("Idempotency-Key", "")
    if not key:
        return ""
    if not IDEMPOTENCY_KEY.fullmatch(key):
        problem = "At most 100 visible ASCII characters (no spaces)."
    elif key.startswith(SCHEDULER_KEY_PREFIX):
        problem = f"Keys starting with {SCHEDULER_KEY_PREFIX!r} are the scheduler's."
    else:
        return key
    raise serializers.ValidationError({"Idempotency-Key": [problem]})


class FencedSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX)


class RenewSerializer(FencedSerializer):
    duration_s = serializers.IntegerField(min_value=1, max_value=MAX_DURATION_S, required=False)


class NodeFencedSerializer(serializers.Serializer):
    """A node's agent proves which lease it updates with its fencing token (leases/api/views.py
    requires it of nodes); a person or an operator may leave it out."""

    fencing_token = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX, required=False)


class ReleaseSerializer(NodeFencedSerializer):
    message = serializers.CharField(max_length=500, required=False, default="")


class UsageSerializer(NodeFencedSerializer):
    """The columns' range here; what the lease and its node allow is checked by
    `services.lease_report_usage` (field errors as well)."""

    cpu_millicores = serializers.IntegerField(min_value=0, max_value=USAGE_MAX)
    memory_mib = serializers.IntegerField(min_value=0, max_value=USAGE_MAX)
    gpu_milli = serializers.IntegerField(min_value=0, max_value=USAGE_MAX, default=0)
