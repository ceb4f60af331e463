from collections.abc import Mapping

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from pools import knobs, validation
from pools.choices import SupportGrantState, TenantRole, TokenScope
from pools.gpu_sharing import gpu_sharing_note
from pools.models import (
    REQUEST_FIELDS,
    ApiToken,
    ComputePool,
    MembershipEvent,
    ResourceShape,
    SchedulingPolicyVersion,
    SupportGrant,
    SupportGrantEvent,
    Tenant,
    TenantSecret,
)
from pools.selectors import resolve_shape


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "created_at"]


class TenantSecretSerializer(serializers.ModelSerializer):
    """Names only on the way out: `value` is write-only and never in any response."""

    name = serializers.CharField(max_length=validation.SECRET_NAME_MAX_CHARS)
    value = serializers.CharField(
        write_only=True,
        trim_whitespace=False,
        max_length=validation.SECRET_VALUE_MAX_BYTES,
        validators=[validation.secret_value],
        style={"input_type": "password"},
    )

    class Meta:
        model = TenantSecret
        fields = ["name", "value", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate_name(self, name):
        validation.secret_name(name)
        return name


class SupportGrantEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")

    class Meta:
        model = SupportGrantEvent
        fields = ["at", "actor", "from_state", "to_state", "reason", "message"]


class SupportGrantSerializer(serializers.ModelSerializer):
    """A tenant admin's grant to one operator: POST {operator, reason, ttl_hours}."""

    operator = serializers.SlugRelatedField(slug_field="username", read_only=True)
    granted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.SerializerMethodField()
    events = SupportGrantEventSerializer(many=True, read_only=True)

    class Meta:
        model = SupportGrant
        fields = [
            "id",
            "operator",
            "reason",
            "state",
            "granted_by",
            "created_at",
            "expires_at",
            "revoked_at",
            "events",
        ]
        read_only_fields = fields

    def get_state(self, grant) -> str:
        """What the grant allows now: an active grant past its expiry reads `expired` even
        before the sweep records it."""
        now = self.context.get("now")
        if grant.state == SupportGrantState.ACTIVE and now and grant.expires_at <= now:
            return SupportGrantState.EXPIRED
        return grant.state


class MembershipEventSerializer(serializers.ModelSerializer):
    """One change to a tenant's members: `member` is the username as it was, `from_role`
    empty for an add, `to_role` "removed" for a removal; `actor` who made it."""

    member = serializers.CharField(source="username")
    actor = serializers.CharField(source="actor_label")
    from_role = serializers.CharField(source="from_state")
    to_role = serializers.CharField(source="to_state")

    class Meta:
        model = MembershipEvent
        fields = ["id", "at", "member", "from_role", "to_role", "reason", "actor", "message"]


class MembershipSerializer(serializers.Serializer):
    # A plain username, not a lookup: whether it names anyone must not show in the answer.
    user = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=TenantRole.choices, default=TenantRole.MEMBER)


class PoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = ComputePool
        fields = ["id", "name", "slug", "trust_level", "description", "heartbeat_interval_s"]


class ShapeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    gpu_sharing_note = serializers.SerializerMethodField()

    class Meta:
        model = ResourceShape
        fields = ["id", "pool", "name", "description", *REQUEST_FIELDS, "gpu_sharing_note"]

    def get_gpu_sharing_note(self, shape) -> str:
        """What the shape's GPUs isolate, in words ("" without GPUs; pools/gpu_sharing.py)."""
        return gpu_sharing_note(shape.as_request())


class KnownFieldsOnly:
    """Refuses keys the serializer does not declare: a typo (`cpu_cores`) must be an error,
    not a request silently served with the defaults."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(dict.fromkeys(unknown, "Unknown field."))
        return super().to_internal_value(data)


def string_list_field():
    """gpu_models, regions, zones: the bounds of pools.validation.string_list, as a field."""
    return serializers.ListField(
        child=serializers.CharField(
            max_length=validation.LIST_ITEM_MAX_CHARS,
            trim_whitespace=False,
            validators=[validation.printable],
        ),
        max_length=validation.LIST_MAX_ITEMS,
        required=False,
    )


PREFERRED_OF = (
    ("cpu_millicores_min", "cpu_millicores_preferred"),
    ("memory_mib_min", "memory_mib_preferred"),
    ("gpu_count", "gpu_count_preferred"),
    ("gpu_memory_mib_min", "gpu_memory_mib_preferred"),
)


class ResourceRequestSerializer(KnownFieldsOnly, serializers.ModelSerializer):
    """An inline resource request: the fields of a shape, validated by the shape's own rules."""

    gpu_models = string_list_field()
    regions = string_list_field()
    zones = string_list_field()
    regions_preferred = string_list_field()
    zones_preferred = string_list_field()

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
        for minimum, preferred in PREFERRED_OF:
            wanted = attrs.get(preferred)
            if wanted is not None and wanted < (attrs.get(minimum) or 0):
                raise serializers.ValidationError(
                    {preferred: "Preferred must be at least the minimum."}
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
    # Absent: the service's defaults (read and write, 90 days), never beyond the token in use.
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TokenScope.choices), required=False
    )
    ttl_days = serializers.IntegerField(min_value=1, max_value=365, write_only=True, required=False)

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
    created_by = serializers.StringRelatedField(allow_null=True)  # null: made by the system

    class Meta:
        model = SchedulingPolicyVersion
        fields = ["number", "weights", "knobs", "comment", "created_by", "created_at"]
        read_only_fields = ["number", "created_by", "created_at"]

    def validate(self, attrs):
        knobs.policy_version(attrs.get("weights", {}), attrs.get("knobs", {}))
        return attrs


class QuotaSerializer(serializers.Serializer):
    """A tenant's quota and credit in one pool with what it uses of each dimension (the quotas
    endpoint, leases/api/quotas.py, fills it): `dimensions` maps each dimension to
    {"limit": number or null (unlimited), "used": number}; `balance` is null without a credit
    account (not credit-limited)."""

    tenant = serializers.CharField()
    pool = serializers.CharField()
    period_days = serializers.IntegerField()
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField()
    dimensions = serializers.DictField(child=serializers.DictField())
    balance = serializers.DecimalField(max_digits=18, decimal_places=4, allow_null=True)


class MemberRoleSerializer(KnownFieldsOnly, serializers.Serializer):
    """`PATCH /tenants/{slug}/members/{username}`: the member's new role."""

    role = serializers.ChoiceField(choices=TenantRole.choices)


class SupportGrantCreateSerializer(KnownFieldsOnly, serializers.Serializer):
    operator = serializers.CharField(max_length=150, help_text="The operator's username")
    reason = serializers.CharField(
        max_length=200, validators=[validation.printable], help_text="A ticket, an incident"
    )
    ttl_hours = serializers.IntegerField(min_value=1, max_value=24 * 7, default=24)
