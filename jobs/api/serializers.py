from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from jobs import networks, object_store
from jobs.assignments import gpu_isolation
from jobs.choices import AntiAffinityScope, JobState
from jobs.images import admit_image
from jobs.models import Job, JobEvent, JobOutput
from jobs.selectors import job_storage
from pools import knobs, network_rules, validation
from pools.api.serializers import KnownFieldsOnly, ResourceRequestSerializer, shape_or_resources
from pools.choices import TenantRole
from pools.gpu_sharing import gpu_sharing_note
from pools.images import parse_image_reference
from pools.models import ComputePool, PriorityClass, Tenant, TenantSecret
from pools.roles import tenant_roles
from storage import mounts as volume_mounts


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = JobEvent
        fields = ["id", "at", "actor", "from_state", "to_state", "reason", "message", "data"]


def _newest_lease(job):
    # prefetched leases (list views) are read without a query per job
    cache = getattr(job, "_prefetched_objects_cache", {})
    if "leases" in cache:
        return max(cache["leases"], key=lambda lease: lease.pk, default=None)
    return job.leases.order_by("-id").first()


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    # null when the job has none: said in the schema (fuzzing found the mismatch)
    shape = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    priority_class = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    usage = serializers.SerializerMethodField()
    gpu_isolation = serializers.SerializerMethodField()
    gpu_sharing_note = serializers.SerializerMethodField()
    forecast = serializers.SerializerMethodField()
    storage = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "tenant",
            "pool",
            "shape",
            "resources",
            "gpu_isolation",
            "gpu_sharing_note",
            "image",
            "image_requested",
            "image_platforms",
            "command",
            "env",
            "secrets",
            "inputs",
            "ports",
            "network_policy",
            "retry_policy",
            "output_destination",
            "output_limit_mib",
            "volumes",
            "labels",
            "affinity",
            "affinity_preferred",
            "anti_affinity",
            "anti_affinity_scope",
            "require_numa",
            "gang",
            "reservation",
            "priority_class",
            "checkpointable",
            "max_runtime_s",
            "state",
            "state_changed_at",
            "attempts",
            "exit_code",
            "route",
            "usage",
            "not_before",
            "created_at",
            "pending_reason",
            "pending_checked_at",
            "forecast",
            "trace_id",
            "storage",
        ]

    # `secrets` is the model's {ENV: secret name} mapping: names only, values never leave the
    # tenant's secrets except towards the agent that runs the job.

    def get_gpu_isolation(self, job) -> str:
        """exclusive | mig | shared-not-isolated (time-slice/MPS) | none (no GPUs)."""
        return gpu_isolation(job.resources)

    def get_gpu_sharing_note(self, job) -> str:
        """What the job's GPUs isolate, in words ("" without GPUs): a time-slice share says it
        has no memory or compute isolation (pools/gpu_sharing.py)."""
        return gpu_sharing_note(job.resources)

    def get_storage(self, job) -> dict:
        """What is ephemeral, what persists (until when) and where the outputs are fetched
        after the lease ends (jobs/selectors.py `job_storage`, docs/storage.md)."""
        return job_storage(job, retentions=self.context.setdefault("retentions", {}))

    def get_forecast(self, job) -> dict:
        """While queued: {"queue_class", "earliest", "latest"} (scheduling/forecast.py)."""
        return job.forecast if job.state == JobState.QUEUED else {}

    def get_usage(self, job) -> dict:
        """Peak and average use of the job's newest lease (recorded from heartbeats)."""
        lease = _newest_lease(job)
        return {
            "peak": getattr(lease, "usage_peak", None) or {},
            "average": getattr(lease, "usage_average", None) or {},
        }


class JobOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobOutput
        # location: "s3://bucket/key" of an output in the tenant's own bucket ("" otherwise)
        fields = ["name", "size", "sha256", "attempt", "location", "created_at"]


class JobSubmitSerializer(KnownFieldsOnly, serializers.Serializer):
    tenant = serializers.SlugField()
    pool = serializers.SlugField()
    name = serializers.CharField(max_length=100)
    shape = serializers.SlugField(required=False, help_text="A catalogue shape of the pool")
    resources = ResourceRequestSerializer(required=False, help_text="Or an inline shape")
    image = serializers.CharField(max_length=300, trim_whitespace=False)  # parsed as sent
    command = serializers.ListField(
        child=serializers.CharField(max_length=validation.COMMAND_ITEM_MAX_CHARS),
        max_length=validation.COMMAND_MAX_ITEMS,
        default=list,
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=validation.ENV_VALUE_MAX_CHARS),
        validators=[validation.env_mapping],
        default=dict,
    )
    priority_class = serializers.SlugField(required=False)
    checkpointable = serializers.BooleanField(default=False)
    max_runtime_s = serializers.IntegerField(min_value=1, max_value=30 * 86400, default=3600)
    # The data plane's fields (docs/data-plane.md), checked and normalised by pools.validation.
    secrets = serializers.JSONField(
        default=dict,
        validators=[validation.secrets_mapping],
        help_text="{NAME: secret name}: the file /run/secrets/NAME, its path in $NAME_FILE",
    )
    inputs = serializers.JSONField(default=list, help_text='URLs or [{"url", "name"}]')
    ports = serializers.JSONField(default=list, help_text="Container ports to publish")
    network_policy = serializers.JSONField(required=False, help_text='{"mode": "none"}')
    retry_policy = serializers.JSONField(required=False)
    output_destination = serializers.JSONField(default="", help_text='"": artifact storage')
    volumes = serializers.JSONField(
        default=list,
        help_text='The tenant\'s volumes it mounts: [{"volume": id, "path": "/data", '
        '"read_only": false}] (docs/storage.md "Persistent volumes")',
    )
    output_limit_mib = serializers.IntegerField(
        min_value=1,
        max_value=knobs.OUTPUT_LIMIT_MAX_MIB,
        required=False,
        help_text="/outputs is a filesystem of this size (default: the pool's knob)",
    )
    # Placement (docs/scheduler.md "Labels and affinity"), label maps checked by pools.validation.
    labels = serializers.JSONField(default=dict, help_text='This job\'s labels {"team": "a"}')
    affinity = serializers.JSONField(default=dict, help_text="Node labels required {key: value}")
    affinity_preferred = serializers.JSONField(
        default=dict, help_text="Node labels preferred {key: value}: the more match, the better"
    )
    anti_affinity = serializers.JSONField(
        default=dict, help_text="Avoid nodes running work with any of these labels {key: value}"
    )
    anti_affinity_scope = serializers.ChoiceField(
        choices=AntiAffinityScope.choices,
        default=AntiAffinityScope.HOST,
        help_text='Where anti_affinity looks: "host" (the node) or "zone" (every node of its '
        "zone; not for gangs)",
    )
    require_numa = serializers.BooleanField(
        default=False, help_text="CPU and memory (and GPUs) from one NUMA node"
    )

    gang = serializers.JSONField(
        default=dict,
        help_text='Placed all or none with its gang\'s other jobs {"name", "size", "topology"}',
    )
    reservation = serializers.IntegerField(
        min_value=1,
        max_value=validation.BIGINT_MAX,
        required=False,
        help_text="A reservation of the tenant in the pool (a lease made with a window): the job "
        "runs on it once its window opens",
    )

    def validate_labels(self, value):
        return validation.label_map(value)

    def validate_affinity(self, value):
        return validation.label_map(value)

    def validate_affinity_preferred(self, value):
        return validation.label_map(value)

    def validate_anti_affinity(self, value):
        return validation.label_map(value)

    def validate_gang(self, value):
        return validation.job_gang(value)

    def validate_inputs(self, value):
        return validation.job_inputs(value)

    def validate_ports(self, value):
        return validation.job_ports(value)

    def validate_network_policy(self, value):
        return network_rules.network_policy(value)

    def validate_retry_policy(self, value):
        return validation.retry_policy(value)

    def validate_volumes(self, value):
        return validation.job_volumes(value)

    def validate_output_destination(self, value):
        return validation.output_destination(value)

    def validate_image(self, image):
        # Syntax is a field error (400); what the registry and the pool say is a 422 in validate().
        try:
            parse_image_reference(image)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return image

    def validate_tenant(self, slug):
        user = self.context["request"].user
        tenant = Tenant.objects.filter(slug=slug, pk__in=list(tenant_roles(user))).first()
        if tenant is None:
            # Same answer for "does not exist" and "not yours": tenants stay invisible.
            raise serializers.ValidationError("No tenant of yours has this slug.")
        if tenant_roles(user)[tenant.pk] not in (TenantRole.MEMBER, TenantRole.ADMIN):
            raise serializers.ValidationError("Your role in this tenant cannot submit.")
        return tenant

    def validate_pool(self, slug):
        pool = ComputePool.objects.filter(slug=slug).first()
        if pool is None:
            raise serializers.ValidationError("No pool has this slug.")
        return pool

    def validate_priority_class(self, name):
        return name  # resolved in validate(): whether a class is open depends on the tenant

    def validate(self, attrs):
        try:
            validation.anti_affinity_scope(
                attrs.get("anti_affinity_scope", AntiAffinityScope.HOST),
                anti_affinity=attrs.get("anti_affinity"),
                gang=attrs.get("gang"),
            )
        except DjangoValidationError as error:
            raise serializers.ValidationError({"anti_affinity_scope": error.messages}) from error
        if "priority_class" in attrs:
            # One answer for "no such class" and "not open to you": restricted ones stay unnamed.
            user = self.context["request"].user
            allowed = PriorityClass.objects.allowed_to(user, attrs["tenant"])
            attrs["priority_class"] = allowed.filter(name=attrs["priority_class"]).first()
            if attrs["priority_class"] is None:
                message = "No priority class of this name is open to you in this tenant."
                raise serializers.ValidationError({"priority_class": message})
        pool = attrs["pool"]
        shape, request = shape_or_resources(attrs)
        if shape is not None:
            attrs["shape"] = shape
        self._check_runtime(pool, shape, request)
        self._check_secrets(attrs)
        self._check_networks(attrs)
        self._check_object_store(attrs)
        self._check_volumes(attrs, request)
        # Last, since it asks the registry: 422 image_invalid / image_not_allowed /
        # image_signature_invalid (ImageRefused), nothing stored or reserved.
        admitted = admit_image(
            pool,
            attrs["image"],
            architecture=request.get("architecture") or "",
            os=request.get("os") or "",
        )
        attrs["image"], attrs["image_requested"] = admitted.pinned, admitted.requested
        attrs["image_platforms"] = admitted.platforms
        return attrs

    def _check_runtime(self, pool, shape, request):
        """A pool's `required_runtime` refuses a request for a weaker runtime (never raised
        silently: the tenant learns which shape to use)."""
        required = knobs.knobs_for(pool).required_runtime
        runtime = request.get("container_runtime") or "docker"
        if not knobs.runtime_below(runtime, required):
            return
        message = (
            f"Pool {pool.slug} runs jobs under {required} only (its required_runtime); "
            f"this asks for {runtime}."
        )
        if shape is not None:
            raise serializers.ValidationError({"shape": message})
        raise serializers.ValidationError({"resources": {"container_runtime": [message]}})

    def _check_volumes(self, attrs, request):
        """Each mount names a live volume of the tenant in the job's pool, all of them on one
        node (the job is pinned there); a request pinned to another node cannot mount them."""
        try:
            pinned = volume_mounts.resolve(attrs["tenant"], attrs["pool"], attrs.get("volumes"))
        except volume_mounts.MountRefused as error:
            raise serializers.ValidationError({"volumes": str(error)}) from error
        if pinned and request.get("node_pin") and request["node_pin"] != pinned.node_name:
            message = (
                f"Its volumes live on node {pinned.node_name}; the request is pinned to "
                f"{request['node_pin']}."
            )
            raise serializers.ValidationError({"volumes": message})

    def _check_object_store(self, attrs):
        """s3:// inputs and an s3:// output destination name buckets the tenant registered
        (jobs/object_store.py): a 400 on the entry otherwise."""
        errors = object_store.submit_errors(
            attrs["tenant"], attrs.get("inputs") or [], attrs.get("output_destination") or ""
        )
        if errors:
            raise serializers.ValidationError(errors)

    def _check_networks(self, attrs):
        """The pool's address rules: inputs and egress that name refused addresses, or egress
        beyond the pool's egress_allowed, are 400s on the entry (jobs/networks.py)."""
        errors = {}
        if found := networks.input_errors(attrs["pool"], attrs.get("inputs") or []):
            errors["inputs"] = found
        policy = attrs.get("network_policy") or {}
        if found := networks.egress_errors(attrs["pool"], policy):
            errors["network_policy"] = found
        if errors:
            raise serializers.ValidationError(errors)

    def _check_secrets(self, attrs):
        """Every secret named exists in the job's tenant; env sets neither a secret's NAME nor
        the NAME_FILE the agent sets to its file's path."""
        wanted = attrs.get("secrets") or {}
        taken = set(wanted) | {f"{name}_FILE" for name in wanted}
        both = sorted(taken & set(attrs.get("env") or {}))
        if both:
            message = f"{', '.join(both)[:200]}: set in env and by secrets; choose one."
            raise serializers.ValidationError({"secrets": message})
        names = set(wanted.values())
        known = set(
            TenantSecret.objects.filter(tenant=attrs["tenant"], name__in=names).values_list(
                "name", flat=True
            )
        )
        missing = sorted(names - known)
        if missing:
            message = f"Tenant {attrs['tenant'].slug} has no secret named {missing[0]!r}."
            raise serializers.ValidationError({"secrets": message})
