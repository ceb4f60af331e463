"""Bodies of /api/v1/volumes (docs/api.md; docs/storage.md "Persistent volumes")."""

from rest_framework import serializers

from pools.api.serializers import KnownFieldsOnly
from pools.choices import TenantRole
from pools.knobs import RETENTION_MAX_DAYS
from pools.models import ComputePool, Tenant
from pools.roles import tenant_roles
from storage import selectors
from storage.models import Volume, VolumeEvent

# one volume's size at most (MiB): 16 TiB
VOLUME_SIZE_MAX_MIB = 16 * 1024 * 1024


class VolumeCreateSerializer(KnownFieldsOnly, serializers.Serializer):
    tenant = serializers.SlugField()
    pool = serializers.SlugField()
    name = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        max_length=63,
        error_messages={"invalid": "Lower-case letters, digits and '-', 1 … 63 characters."},
    )
    size_mib = serializers.IntegerField(min_value=1, max_value=VOLUME_SIZE_MAX_MIB)
    zone = serializers.CharField(max_length=40, required=False, default="", allow_blank=True)
    node = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    retention_days = serializers.IntegerField(
        min_value=1, max_value=RETENTION_MAX_DAYS, required=False, default=None, allow_null=True
    )

    def validate_tenant(self, slug):
        user = self.context["request"].user
        roles = tenant_roles(user)
        tenant = Tenant.objects.filter(slug=slug, pk__in=list(roles)).first()
        if tenant is None:  # one answer for "does not exist" and "not yours"
            raise serializers.ValidationError("No tenant of yours has this slug.")
        if roles[tenant.pk] not in (TenantRole.MEMBER, TenantRole.ADMIN):
            raise serializers.ValidationError("Your role in this tenant cannot create volumes.")
        return tenant

    def validate_pool(self, slug):
        pool = ComputePool.objects.filter(slug=slug).first()
        if pool is None:
            raise serializers.ValidationError("No pool has this slug.")
        return pool

    def validate(self, attrs):
        if attrs.get("zone") and attrs.get("node"):
            raise serializers.ValidationError({"node": "Name a node or a zone, not both."})
        return attrs


class ExportSerializer(KnownFieldsOnly, serializers.Serializer):
    destination = serializers.CharField(max_length=300)


class VolumeSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    node_state = serializers.SerializerMethodField()
    at_risk = serializers.SerializerMethodField()
    at_risk_reason = serializers.SerializerMethodField()
    holder_job = serializers.IntegerField(source="holder_job_id", read_only=True)
    readers = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = [
            "id",
            "tenant",
            "pool",
            "name",
            "size_mib",
            "zone",
            "node",
            "node_state",
            "state",
            "state_changed_at",
            "holder_job",
            "readers",
            "retention_days",
            "created_at",
            "last_attached_at",
            "last_detached_at",
            "expires_at",
            "used_bytes",
            "used_reported_at",
            "at_risk",
            "at_risk_reason",
        ]
        read_only_fields = fields

    def get_node_state(self, volume) -> str:
        if volume.node.reachability == "unreachable":
            return f"{volume.node.state} (unreachable)"
        return volume.node.state

    def get_at_risk(self, volume) -> bool:
        return bool(selectors.at_risk(volume))

    def get_at_risk_reason(self, volume) -> str:
        return selectors.at_risk(volume)

    def get_readers(self, volume) -> list[int]:
        return sorted(a.job_id for a in volume.attachments.all() if a.read_only)


class VolumeEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = VolumeEvent
        fields = [
            "id",
            "at",
            "actor_kind",
            "actor_label",
            "from_state",
            "to_state",
            "reason",
            "message",
            "data",
        ]
        read_only_fields = fields


class VolumeReportSerializer(serializers.Serializer):
    """What a node's agent holds: `[{"id", "used_bytes"}]` (worker_agent/volumes.py)."""

    class Held(serializers.Serializer):
        id = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
        used_bytes = serializers.IntegerField(min_value=0, max_value=2**63 - 1, default=0)

    volumes = Held(many=True, max_length=10_000)
