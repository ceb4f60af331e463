from rest_framework import serializers

from jobs.models import Job, JobEvent
from jobs.selectors import image_refusal
from pools import validation
from pools.api.serializers import KnownFieldsOnly, ResourceRequestSerializer, shape_or_resources
from pools.choices import TenantRole
from pools.models import ComputePool, PriorityClass, Tenant
from pools.roles import tenant_roles


class JobEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = JobEvent
        fields = ["at", "actor", "from_state", "to_state", "reason", "message", "data"]


class JobSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    shape = serializers.SlugRelatedField(slug_field="name", read_only=True)
    priority_class = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "tenant",
            "pool",
            "shape",
            "resources",
            "image",
            "command",
            "env",
            "priority_class",
            "checkpointable",
            "max_runtime_s",
            "state",
            "state_changed_at",
            "attempts",
            "exit_code",
            "created_at",
            "pending_reason",
            "pending_checked_at",
        ]


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
        if "priority_class" in attrs:
            # One answer for "no such class" and "not open to you": restricted ones stay unnamed.
            user = self.context["request"].user
            allowed = PriorityClass.objects.allowed_to(user, attrs["tenant"])
            attrs["priority_class"] = allowed.filter(name=attrs["priority_class"]).first()
            if attrs["priority_class"] is None:
                message = "No priority class of this name is open to you in this tenant."
                raise serializers.ValidationError({"priority_class": message})
        pool = attrs["pool"]
        shape, _ = shape_or_resources(attrs)
        if shape is not None:
            attrs["shape"] = shape
        refusal = image_refusal(pool, attrs["image"])
        if refusal:
            raise serializers.ValidationError({"image": refusal}, code="image_invalid")
        return attrs
