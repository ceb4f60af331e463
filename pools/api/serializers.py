from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from pools.choices import TenantRole, TokenScope
from pools.models import (
    REQUEST_FIELDS,
    ApiToken,
    ComputePool,
    ResourceShape,
    SchedulingPolicyVersion,
    Tenant,
)
from pools.selectors import resolve_shape


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "created_at"]


class MembershipSerializer(serializers.Serializer):
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.filter(is_active=True)
    )
    role = serializers.ChoiceField(choices=TenantRole.choices, default=TenantRole.MEMBER)


class PoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = ComputePool
        fields = ["id", "name", "slug", "trust_level", "description", "heartbeat_interval_s"]


class ShapeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ResourceShape
        fields = ["id", "pool", "name", "description", *REQUEST_FIELDS]


class ResourceRequestSerializer(serializers.ModelSerializer):
    """An inline resource request: the fields of a shape, validated by the shape's own rules."""

    class Meta:
        model = ResourceShape
        fields = REQUEST_FIELDS

    def validate(self, attrs):
        shape = ResourceShape(**attrs)
        try:
            shape.clean_fields(exclude=["pool", "name"])
            shape.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc
        for field in ("cpu_millicores", "memory_mib"):
            preferred = attrs.get(f"{field}_preferred")
            if preferred is not None and preferred < attrs[f"{field}_min"]:
                raise serializers.ValidationError(
                    {f"{field}_preferred": "Preferred must be at least the minimum."}
                )
        return shape.as_request()


def shape_or_resources(attrs: dict):
    """A request names a catalogue shape of its pool or gives resources inline, never both.
    Returns (shape or None, the resource request dict); field errors otherwise."""
    pool = attrs["pool"]
    if ("shape" in attrs) == ("resources" in attrs):
        raise serializers.ValidationError(
            {"shape": "Give exactly one of shape (a catalogue name) or resources (inline)."}
        )
    if "resources" in attrs:
        return None, dict(attrs["resources"])
    shape = resolve_shape(pool, attrs["shape"])
    if shape is None:
        raise serializers.ValidationError({"shape": f"Pool {pool.slug} has no such shape."})
    return shape, shape.as_request()


class ApiTokenSerializer(serializers.ModelSerializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TokenScope.choices),
        default=[TokenScope.READ, TokenScope.WRITE],
    )
    ttl_days = serializers.IntegerField(min_value=1, max_value=365, write_only=True, default=90)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "scopes",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "ttl_days",
        ]
        read_only_fields = ["prefix", "created_at", "expires_at", "last_used_at", "revoked_at"]


class PolicyVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.StringRelatedField()

    class Meta:
        model = SchedulingPolicyVersion
        fields = ["number", "weights", "knobs", "comment", "created_by", "created_at"]
        read_only_fields = ["number", "created_by", "created_at"]

    def validate_weights(self, value):
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and v >= 0 for k, v in value.items()
        ):
            raise serializers.ValidationError("A map of scorer name to a non-negative number.")
        return value
