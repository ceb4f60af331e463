from rest_framework import serializers

from nodes.models import EnrollmentToken, GpuDevice, Node, NodeEvent, NodeProbe
from pools.choices import GpuSharingMode
from pools.models import ComputePool


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuDevice
        fields = [
            "index",
            "uuid",
            "model",
            "memory_mib",
            "driver_version",
            "cuda_version",
            "mig_enabled",
            "mig_slices",
            "sharing_mode",
            "interconnect_group",
            "numa_node",
            "healthy",
            "health",
            "health_reason",
            "health_flags",
            "temperature_c",
        ]


class NodeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    gpus = GpuSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "pool",
            "state",
            "state_changed_at",
            "reachability",
            "reachability_changed_at",
            "last_heartbeat_at",
            "agent_version",
            "architecture",
            "os",
            "runtimes",
            "features",
            "labels",
            "region",
            "zone",
            "rack",
            "network_class",
            "price_class",
            "energy_class",
            "cpu_millicores_raw",
            "memory_mib_raw",
            "scratch_mib_raw",
            "cpu_millicores_allocatable",
            "memory_mib_allocatable",
            "scratch_mib_allocatable",
            "cpu_millicores_reserved",
            "memory_mib_reserved",
            "scratch_mib_reserved",
            "numa_layout",
            "usage",
            "drain_deadline",
            "drained_at",
            "gpus",
        ]


class NodeEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = NodeEvent
        fields = ["at", "actor", "from_state", "to_state", "reason", "message", "data"]


class EnrollmentTokenSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", queryset=ComputePool.objects.all())
    ttl_hours = serializers.IntegerField(
        min_value=1, max_value=24 * 30, write_only=True, default=24
    )
    max_uses = serializers.IntegerField(min_value=1, max_value=10000, default=1)

    class Meta:
        model = EnrollmentToken
        fields = [
            "id",
            "pool",
            "name",
            "prefix",
            "max_uses",
            "uses",
            "expires_at",
            "revoked_at",
            "created_at",
            "ttl_hours",
        ]
        read_only_fields = ["prefix", "uses", "expires_at", "revoked_at", "created_at"]


class InventoryGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, required=False)
    uuid = serializers.CharField(max_length=80)
    model = serializers.CharField(max_length=60)
    memory_mib = serializers.IntegerField(min_value=0)
    driver_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    cuda_version = serializers.CharField(max_length=20, required=False, allow_blank=True)
    mig_enabled = serializers.BooleanField(default=False)
    mig_slices = serializers.ListField(child=serializers.DictField(), default=list)
    sharing_mode = serializers.ChoiceField(choices=GpuSharingMode.choices, required=False)
    interconnect_group = serializers.CharField(max_length=40, required=False, allow_blank=True)
    numa_node = serializers.IntegerField(required=False, allow_null=True)


class InventorySerializer(serializers.Serializer):
    cpu_millicores = serializers.IntegerField(min_value=0)
    memory_mib = serializers.IntegerField(min_value=0)
    scratch_mib = serializers.IntegerField(min_value=0, default=0)
    numa = serializers.ListField(child=serializers.DictField(), default=list)
    gpus = InventoryGpuSerializer(many=True, default=list)

    def validate_gpus(self, gpus):
        uuids = [g["uuid"] for g in gpus]
        if len(set(uuids)) != len(uuids):
            raise serializers.ValidationError("GPU UUIDs must be unique.")
        return gpus


class EnrollSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200, help_text="The enrollment token (cpe_…)")
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    machine_id = serializers.CharField(max_length=100, required=False, allow_blank=True)
    identity = serializers.CharField(
        max_length=4000, required=False, allow_blank=True, help_text="Public key or secret"
    )
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    inventory = InventorySerializer()
    labels = serializers.DictField(child=serializers.CharField(max_length=200), default=dict)
    runtimes = serializers.ListField(child=serializers.CharField(max_length=30), default=list)
    features = serializers.ListField(child=serializers.CharField(max_length=60), default=list)
    architecture = serializers.ChoiceField(choices=["amd64", "arm64"], default="amd64")
    os = serializers.CharField(max_length=20, default="linux")
    region = serializers.CharField(max_length=40, required=False, allow_blank=True)
    zone = serializers.CharField(max_length=40, required=False, allow_blank=True)
    rack = serializers.CharField(max_length=40, required=False, allow_blank=True)
    network_class = serializers.CharField(max_length=40, required=False, allow_blank=True)
    price_class = serializers.CharField(max_length=40, required=False, allow_blank=True)
    energy_class = serializers.CharField(max_length=40, required=False, allow_blank=True)


class GpuHealthSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=80)
    temperature_c = serializers.IntegerField(required=False, allow_null=True)
    slowdown_temperature_c = serializers.IntegerField(required=False, allow_null=True)
    xid_errors = serializers.IntegerField(min_value=0, default=0)
    ecc_errors_uncorrected = serializers.IntegerField(min_value=0, default=0)
    error = serializers.CharField(max_length=200, required=False, allow_blank=True)
    pcie_link_width = serializers.IntegerField(required=False, allow_null=True)
    pcie_link_width_max = serializers.IntegerField(required=False, allow_null=True)
    nvlink_down = serializers.IntegerField(min_value=0, default=0)
    health_check = serializers.ChoiceField(choices=["passed", "failed", ""], default="")


class WorkloadSerializer(serializers.Serializer):
    lease = serializers.IntegerField(required=False)
    job = serializers.IntegerField(required=False)
    state = serializers.CharField(max_length=20, required=False, allow_blank=True)


class HeartbeatSerializer(serializers.Serializer):
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    usage = serializers.DictField(default=dict)
    gpus = GpuHealthSerializer(many=True, default=list)
    workloads = WorkloadSerializer(many=True, default=list)


class ProbeSerializer(serializers.ModelSerializer):
    gpu = serializers.SlugRelatedField(slug_field="uuid", read_only=True)

    class Meta:
        model = NodeProbe
        fields = [
            "id",
            "kind",
            "state",
            "gpu",
            "expected",
            "differences",
            "requested_at",
            "completed_at",
        ]


class ProbeResultSerializer(serializers.Serializer):
    result = serializers.DictField()


class DrainSerializer(serializers.Serializer):
    deadline = serializers.DateTimeField(required=False, allow_null=True)
    message = serializers.CharField(max_length=500, required=False, allow_blank=True)


class MessageSerializer(serializers.Serializer):
    message = serializers.CharField(max_length=500, required=False, allow_blank=True)


class QuarantineSerializer(serializers.Serializer):
    message = serializers.CharField(max_length=500)
