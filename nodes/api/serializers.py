from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import (
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from rest_framework import serializers

from nodes.models import EnrollmentToken, GpuDevice, Node, NodeEvent, NodeProbe
from nodes.selectors import control_plane_id
from nodes.services.identity import checked_public_key
from pools.choices import ContainerRuntime
from pools.models import ComputePool
from pools.validation import (
    BIGINT_MAX,
    NODE_FEATURES_MAX,
    feature_list,
    parse_energy_class,
    parse_price,
)
from worker_agent.schema import (
    INVENTORY_SCHEMA,
    STORAGE_SCHEMA,
    THROTTLE_REASON_NAMES,
    inventory_errors,
    storage_errors,
)


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
            "compute_capability",
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
            "image_pull_seconds",
            # what its heartbeats say of its disk and data transfers (docs/storage.md)
            "disk_total_mib",
            "disk_free_mib",
            "disk_held_mib",
            "disk_reported_at",
            "disk_short",
            "pull_bytes_per_s",
            "download_bytes_per_s",
            "input_download_seconds",
            "drain_deadline",
            "drained_at",
            "gpus",
        ]


class AgentNodeSerializer(NodeSerializer):
    """The asking agent's own node, with the control plane's id (the owner of its containers)."""

    control_plane = serializers.SerializerMethodField()

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "control_plane"]

    def get_control_plane(self, node) -> str:
        return control_plane_id()


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


# --------------------------------------------------------------------------- what nodes send
#
# A node's agent is outside the control plane's trust. Every body it sends (enrollment,
# inventory, heartbeat, probe result) is checked here by type and physically sensible range (the
# inventory by the agent's own schema, worker_agent/schemas/inventory-v1.json), so
# nothing out of range reaches a column or a sweep (an out-of-range GPU once stopped the
# inventory reconciliation of every node), and no list or map is unbounded.

INT_COLUMN_MAX = 2**31 - 1  # Node CPU/memory/scratch and GpuDevice.memory_mib: PostgreSQL integer
COUNTER_MAX = BIGINT_MAX  # error counters, usage and benchmark numbers, lease and job ids
GPU_MEMORY_MAX_MIB = 2**20  # 1 TiB on one device
GPUS_MAX = 64  # devices on one node
CPUS_MAX = 16384  # logical CPUs on one node
TEMPERATURE_C = (-50, 200)
PCIE_WIDTH_MAX = 64  # lanes
NVLINKS_MAX = 64
WORKLOADS_MAX = 1024  # leases running on one node
LABELS_MAX, LABEL_KEY_MAX = 64, 100
RUNTIMES_MAX, FEATURES_MAX = 16, NODE_FEATURES_MAX
MAP_MAX = 64  # entries in heartbeat usage and a probe's benchmark


class FeaturesField(serializers.ListField):
    """A node's `features` (what the scheduler's `node_features` filter reads): the rule of
    pools.validation.feature_list, on the value as sent (a number is not a name, a name is not
    lowercased for it): a 400 otherwise, never stored raw."""

    child = serializers.CharField(max_length=40)  # what the schema shows

    def to_internal_value(self, data):
        try:
            return list(feature_list(data, max_items=FEATURES_MAX))
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from exc


def bounded_int(low, high, **kwargs):
    return serializers.IntegerField(min_value=low, max_value=high, **kwargs)


def temperature(**kwargs):
    return bounded_int(*TEMPERATURE_C, required=False, allow_null=True, **kwargs)


class NumberField(serializers.FloatField):
    """A JSON number (never a string or a bool), kept an int when sent as one."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        number = super().to_internal_value(data)  # refuses NaN and infinities
        return data if isinstance(data, int) else number


class BoundedDictField(serializers.DictField):
    """A map of at most `max_entries` keys of at most `max_key_length` characters."""

    def __init__(self, *, max_entries=MAP_MAX, max_key_length=LABEL_KEY_MAX, **kwargs):
        self.max_entries, self.max_key_length = max_entries, max_key_length
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            if len(data) > self.max_entries:
                raise serializers.ValidationError(f"At most {self.max_entries} entries.")
            if any(len(str(key)) > self.max_key_length for key in data):
                raise serializers.ValidationError(
                    f"Keys have at most {self.max_key_length} characters."
                )
        return super().to_internal_value(data)


class InventorySerializer(serializers.Serializer):
    """A node's inventory, checked against the schema the agent itself checks it with
    (worker_agent/schemas/inventory-v1.json: every number typed and ranged, every list bounded).
    A refusal is a 400 whose field errors follow the path: {"gpus": {"0": {"index": [...]}}}."""

    def to_internal_value(self, data):
        errors = inventory_errors(data)
        if errors:
            raise serializers.ValidationError(error_tree(errors))
        return data

    def to_representation(self, instance):
        return instance


class InventoryOpenApi(OpenApiSerializerExtension):
    """The API's documentation shows the inventory schema itself."""

    target_class = InventorySerializer

    def map_serializer(self, auto_schema, direction):
        return as_openapi_30({k: v for k, v in INVENTORY_SCHEMA.items() if not k.startswith("$")})


def as_openapi_30(schema):
    """JSON Schema 2020-12 as OpenAPI 3.0 says it: `"type": [T, "null"]` → `nullable`, `const`
    → a one-value `enum`."""
    if isinstance(schema, list):
        return [as_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: as_openapi_30(value) for key, value in schema.items()}
    if "const" in converted:  # 3.0 has no const: a one-value enum says the same
        converted["enum"] = [converted.pop("const")]
    kinds = schema.get("type")
    if isinstance(kinds, list) and "null" in kinds:
        rest = [kind for kind in kinds if kind != "null"]
        converted["type"] = rest[0] if len(rest) == 1 else rest
        converted["nullable"] = True
    return converted


def error_tree(errors) -> dict | list:
    """(path, message) pairs as DRF's nested field errors; a node's own messages sit beside its
    fields' under "non_field_errors" (as a serializer's do), or are the whole answer at the top."""
    tree: dict = {}
    for path, message in errors:
        node = tree
        for step in path:
            node = node.setdefault(str(step), {})
        node.setdefault("non_field_errors", []).append(message)

    def collapse(node):
        children = {
            key: collapse(child) for key, child in node.items() if key != "non_field_errors"
        }
        own = node.get("non_field_errors", [])
        return own if not children else children | ({"non_field_errors": own} if own else {})

    return collapse(tree)


class KeyRotationSerializer(serializers.Serializer):
    public_key = serializers.CharField(max_length=64, help_text="The new key (base64, raw)")
    proof = serializers.CharField(
        max_length=200, help_text="The new key's signature (base64) over the rotation statement"
    )


class EnrollSerializer(serializers.Serializer):
    token = serializers.CharField(max_length=200, help_text="The enrollment token (cpe_…)")
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    machine_id = serializers.CharField(max_length=100, required=False, allow_blank=True)
    public_key = serializers.CharField(
        max_length=64,
        help_text="The node's Ed25519 public key (base64 of its 32 raw bytes); the enrollment "
        "request is signed by it, and so is every later request of the node",
    )
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    inventory = InventorySerializer()
    labels = BoundedDictField(
        child=serializers.CharField(max_length=200), max_entries=LABELS_MAX, default=dict
    )
    runtimes = serializers.ListField(
        child=serializers.CharField(max_length=30), max_length=RUNTIMES_MAX, default=list
    )
    features = FeaturesField(default=list)
    architecture = serializers.ChoiceField(choices=["amd64", "arm64"], default="amd64")
    os = serializers.CharField(max_length=20, default="linux")
    region = serializers.CharField(max_length=40, required=False, allow_blank=True)
    zone = serializers.CharField(max_length=40, required=False, allow_blank=True)
    rack = serializers.CharField(max_length=40, required=False, allow_blank=True)
    network_class = serializers.CharField(max_length=40, required=False, allow_blank=True)
    price_class = serializers.CharField(
        max_length=40, required=False, allow_blank=True, help_text="price per hour, e.g. 0.85"
    )
    energy_class = serializers.CharField(
        max_length=40, required=False, allow_blank=True, help_text="0…9 or A…G, 0 = A = best"
    )

    def validate_public_key(self, value):
        try:
            return checked_public_key(value)
        except ValueError as exc:
            raise serializers.ValidationError(f"Not an Ed25519 public key: {exc}.") from exc

    def validate_price_class(self, value):
        if value and parse_price(value) is None:
            raise serializers.ValidationError("A price per hour: a number from 0 to 1000000.")
        return value

    def validate_energy_class(self, value):
        if value and parse_energy_class(value) is None:
            raise serializers.ValidationError("An energy class: 0…9 or A…G (0 = A = best).")
        return value


RETIRED_MAX = 65536  # retired pages or remapped rows of one device
XIDS_MAX, XID_MAX = 64, 65535  # Xid events in one heartbeat, an Xid number


class StrictBooleanField(serializers.BooleanField):
    """A JSON true or false, never "yes" or 1."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=str(data)[:20])
        return data


class NvLinkErrorsSerializer(serializers.Serializer):
    """NVLink error counters summed over a device's links, cumulative."""

    crc_flit = bounded_int(0, COUNTER_MAX, required=False)
    crc_data = bounded_int(0, COUNTER_MAX, required=False)
    replay = bounded_int(0, COUNTER_MAX, required=False)
    recovery = bounded_int(0, COUNTER_MAX, required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict) and set(data) - set(self.fields):
            raise serializers.ValidationError(f"Only {', '.join(self.fields)}.")
        return super().to_internal_value(data)


class GpuReadingSerializer(serializers.Serializer):
    """One device's NVML readings (nodes.health_rules.gpu_health_evaluate reads them)."""

    temperature_c = temperature()
    slowdown_temperature_c = temperature()
    xid_errors = bounded_int(0, COUNTER_MAX, required=False)
    ecc_errors_uncorrected = bounded_int(0, COUNTER_MAX, required=False)
    error = serializers.CharField(max_length=200, required=False, allow_blank=True)
    # the current width is 0 while the link is down; the maximum never is
    pcie_link_width = bounded_int(0, PCIE_WIDTH_MAX, required=False, allow_null=True)
    pcie_link_width_max = bounded_int(1, PCIE_WIDTH_MAX, required=False, allow_null=True)
    nvlink_down = bounded_int(0, NVLINKS_MAX, required=False)
    health_check = serializers.ChoiceField(choices=["passed", "failed", ""], required=False)
    # the NVML health readings (worker_agent/schemas/gpu-health-v1.json holds the same bounds;
    # nodes.health_rules judges them, one rule and reason code each)
    ecc_volatile_corrected = bounded_int(0, COUNTER_MAX, required=False)
    ecc_volatile_uncorrected = bounded_int(0, COUNTER_MAX, required=False)
    ecc_aggregate_corrected = bounded_int(0, COUNTER_MAX, required=False)
    ecc_aggregate_uncorrected = bounded_int(0, COUNTER_MAX, required=False)
    retired_pages_sbe = bounded_int(0, RETIRED_MAX, required=False)
    retired_pages_dbe = bounded_int(0, RETIRED_MAX, required=False)
    retired_pages_pending = StrictBooleanField(required=False)
    remapped_rows_correctable = bounded_int(0, RETIRED_MAX, required=False)
    remapped_rows_uncorrectable = bounded_int(0, RETIRED_MAX, required=False)
    remapped_rows_pending = StrictBooleanField(required=False)
    remapped_rows_failure = StrictBooleanField(required=False)
    xids = serializers.ListField(child=bounded_int(0, XID_MAX), max_length=XIDS_MAX, required=False)
    throttle_reasons = serializers.ListField(
        child=serializers.ChoiceField(choices=THROTTLE_REASON_NAMES),
        max_length=len(THROTTLE_REASON_NAMES),
        required=False,
    )
    nvlink_errors = NvLinkErrorsSerializer(required=False)

    def validate_throttle_reasons(self, value):
        return list(dict.fromkeys(value))


class GpuHealthSerializer(GpuReadingSerializer):
    uuid = serializers.CharField(max_length=80)


class WorkloadUsageSerializer(serializers.Serializer):
    """What the agent measured of one job (the ledger bounds it further by its lease)."""

    cpu_millicores = bounded_int(0, INT_COLUMN_MAX, required=False)
    memory_mib = bounded_int(0, INT_COLUMN_MAX, required=False)
    gpu_utilization_percent = NumberField(min_value=0, max_value=100, required=False)
    gpu_memory_mib = bounded_int(0, GPU_MEMORY_MAX_MIB * GPUS_MAX, required=False)
    net_tx_bytes = bounded_int(0, COUNTER_MAX, required=False)  # egress, counted by quotas


class WorkloadSerializer(serializers.Serializer):
    lease = bounded_int(1, COUNTER_MAX, required=False)
    job = bounded_int(1, COUNTER_MAX, required=False)
    state = serializers.CharField(max_length=20, required=False, allow_blank=True)
    usage = WorkloadUsageSerializer(required=False)


IMAGES_MAX = 512  # image digests in one node's local cache
IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"


class StoragePartField(serializers.Field):
    """One storage part of a heartbeat (`disk`, `cache`, `downloads`), checked against the
    schema the agent checks it with (worker_agent/schemas/storage-v1.json): what a node sends
    is bounded in entries, lengths and values, or the heartbeat is a 400 and nothing of it is
    written (docs/storage.md)."""

    def __init__(self, part: str, **kwargs):
        self.part = part
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        errors = storage_errors({self.part: data})
        if errors:
            tree = error_tree(errors)
            raise serializers.ValidationError(
                tree.get(self.part, tree) if isinstance(tree, dict) else tree
            )
        return data

    def to_representation(self, value):
        return value


class StoragePartOpenApi(OpenApiSerializerFieldExtension):
    """The API's documentation shows the storage schema's part."""

    target_class = StoragePartField

    def map_serializer_field(self, auto_schema, direction):
        part = STORAGE_SCHEMA["properties"][self.target.part]
        return as_openapi_30(_inline_refs(part, STORAGE_SCHEMA["$defs"]))


def _inline_refs(schema, defs):
    """`{"$ref": "#/$defs/x"}` replaced by the definition itself (OpenAPI has no $defs)."""
    if isinstance(schema, list):
        return [_inline_refs(item, defs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _inline_refs(defs[schema["$ref"].rpartition("/")[2]], defs)
    return {key: _inline_refs(value, defs) for key, value in schema.items()}


class HeartbeatSerializer(serializers.Serializer):
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    usage = BoundedDictField(child=NumberField(min_value=0, max_value=COUNTER_MAX), default=dict)
    gpus = GpuHealthSerializer(many=True, default=list, max_length=GPUS_MAX)
    workloads = WorkloadSerializer(many=True, default=list, max_length=WORKLOADS_MAX)
    # absent: the cache is unknown (kept as it was); [] : the cache is empty
    images = serializers.ListField(
        child=serializers.RegexField(IMAGE_DIGEST, max_length=71),
        max_length=IMAGES_MAX,
        required=False,
    )
    runtime = serializers.ChoiceField(choices=["docker", "process"], required=False)
    # what the agent offers now (docs/data-plane.md "Runtimes"); absent: kept as they were
    runtimes = serializers.ListField(
        child=serializers.ChoiceField(choices=ContainerRuntime.choices),
        max_length=RUNTIMES_MAX,
        required=False,
    )
    # the features it has now, as at enrollment ("avx512", "sgx"); absent: kept as they were
    features = FeaturesField(required=False)
    # storage (docs/storage.md): the work root's disk, the node's caches, the inputs it
    # downloaded since its last heartbeat; each absent: kept as it was
    disk = StoragePartField("disk", required=False)
    cache = StoragePartField("cache", required=False)
    downloads = StoragePartField("downloads", required=False)


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
            "challenge",
            "differences",
            "requested_at",
            "completed_at",
        ]


class MeasuredGpuSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=80)
    model = serializers.CharField(max_length=60, required=False, allow_blank=True)
    memory_mib = bounded_int(0, GPU_MEMORY_MAX_MIB, required=False)


PROBE_WORKERS_MAX = 64  # parallel chains of a challenge (the control plane asks ≤ 16)
HEX64 = r"^[0-9a-f]{64}$"


class ChallengeAnswerSerializer(serializers.Serializer):
    """What the probe container answered (nodes.challenge.challenge_differences checks it)."""

    answers = serializers.ListField(
        child=serializers.RegexField(HEX64, max_length=64),
        max_length=PROBE_WORKERS_MAX,
        default=list,
    )
    seconds = NumberField(min_value=0, max_value=86400, required=False)
    memory_mib = bounded_int(0, INT_COLUMN_MAX, required=False)
    gpus = serializers.ListField(
        child=serializers.CharField(max_length=80), max_length=GPUS_MAX * 8, default=list
    )
    error = serializers.CharField(max_length=500, required=False, allow_blank=True)


GPU_SAMPLES_MAX = 1024  # words read back per GPU (worker_agent.gpu_kernel.SAMPLES_MAX)
HEX16 = r"^[0-9a-f]{16}$"


class GpuKernelGpuSerializer(serializers.Serializer):
    """One GPU's answer to the GPU challenge (nodes.challenge.gpu_challenge_differences)."""

    uuid = serializers.CharField(max_length=80)
    model = serializers.CharField(max_length=96, required=False, allow_blank=True)
    memory_mib = bounded_int(0, GPU_MEMORY_MAX_MIB, required=False)
    cuda_name = serializers.CharField(max_length=96, required=False, allow_blank=True)
    cuda_memory_mib = bounded_int(0, GPU_MEMORY_MAX_MIB, required=False)
    samples = serializers.ListField(
        child=serializers.RegexField(HEX16, max_length=16), max_length=GPU_SAMPLES_MAX, default=list
    )
    fill_seconds = NumberField(min_value=0, max_value=86400, required=False)
    fma_seconds = NumberField(min_value=0, max_value=86400, required=False)
    gflops = NumberField(min_value=0, max_value=COUNTER_MAX, required=False)
    fma_check = NumberField(min_value=-(2**31), max_value=2**31, required=False)
    error = serializers.CharField(max_length=500, required=False, allow_blank=True)


class GpuKernelAnswerSerializer(serializers.Serializer):
    """The GPU challenge's answer: one entry per GPU, or the `error` why none ran."""

    gpus = GpuKernelGpuSerializer(many=True, max_length=GPUS_MAX, default=list)
    seconds = NumberField(min_value=0, max_value=86400, required=False)
    error = serializers.CharField(max_length=500, required=False, allow_blank=True)


class ProbeMeasurementSerializer(GpuReadingSerializer):
    """What a probe measured: the node's resources (validation, compared with its claims by
    nodes.claims.compare_claims) or one device's readings (recovery)."""

    passed = serializers.BooleanField(required=False)
    cpu_count = bounded_int(0, CPUS_MAX, required=False)
    cpu_millicores = bounded_int(0, INT_COLUMN_MAX, required=False)
    memory_mib = bounded_int(0, INT_COLUMN_MAX, required=False)
    gpus = MeasuredGpuSerializer(many=True, required=False, max_length=GPUS_MAX)
    benchmark = BoundedDictField(
        child=NumberField(min_value=0, max_value=COUNTER_MAX), required=False
    )
    challenge = ChallengeAnswerSerializer(required=False)
    gpu_kernel = GpuKernelAnswerSerializer(required=False)  # validation and recovery alike


class ProbeResultSerializer(serializers.Serializer):
    result = ProbeMeasurementSerializer()


class DrainSerializer(serializers.Serializer):
    deadline = serializers.DateTimeField(required=False, allow_null=True)
    message = serializers.CharField(max_length=500, required=False, allow_blank=True)


class MessageSerializer(serializers.Serializer):
    message = serializers.CharField(max_length=500, required=False, allow_blank=True)


class QuarantineSerializer(serializers.Serializer):
    message = serializers.CharField(max_length=500)
