from rest_framework import serializers

from jobs.models import Job, JobEvent
from jobs.selectors import image_refusal
from pools.api.serializers import ResourceRequestSerializer, shape_or_resources
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


class JobSubmitSerializer(serializers.Serializer):
    tenant = serializers.SlugField()
    pool = serializers.SlugField()
    name = serializers.CharField(max_length=100)
    shape = serializers.SlugField(required=False, help_text="A catalogue shape of the pool")
    resources = ResourceRequestSerializer(required=False, help_text="Or an inline shape")
    image = serializers.CharField(max_length=300)
    command = serializers.ListField(child=serializers.CharField(), default=list)
    env = serializers.DictField(child=serializers.CharField(), default=dict)
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
        priority = PriorityClass.objects.filter(name=name).first()
        if priority is None:
            raise serializers.ValidationError("No priority class has this name.")
        return priority

    def validate(self, attrs):
        pool = attrs["pool"]
        shape, _ = shape_or_resources(attrs)
        if shape is not None:
            attrs["shape"] = shape
        refusal = image_refusal(pool, attrs["image"])
        if refusal:
            raise serializers.ValidationError({"image": refusal}, code="image_invalid")
        return attrs
