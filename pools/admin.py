"""Policy admins edit the catalogue here. Policy versions are immutable: edit = new version."""

from decimal import Decimal

from django import forms
from django.contrib import admin

from . import knobs, services
from .actors import Actor
from .models import (
    AllowedRegistry,
    ComputePool,
    CreditAccount,
    CreditCharge,
    Membership,
    PoolTrustedKey,
    PriorityClass,
    Quota,
    ResourceShape,
    SchedulingPolicy,
    SchedulingPolicyVersion,
    Tenant,
    TenantSecret,
)
from .services import policy_version_publish


@admin.register(ComputePool)
class ComputePoolAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "trust_level", "sensitive", "heartbeat_interval_s"]
    list_filter = ["sensitive"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(PoolTrustedKey)
class PoolTrustedKeyAdmin(admin.ModelAdmin):
    """The keys whose image signatures a sensitive pool accepts."""

    list_display = ["name", "pool", "created_at"]
    list_filter = ["pool"]


@admin.register(TenantSecret)
class TenantSecretAdmin(admin.ModelAdmin):
    """Names only: the value is never shown, not even to operators (tenants set it)."""

    list_display = ["name", "tenant", "updated_at"]
    list_filter = ["tenant"]
    fields = ["tenant", "name", "created_at", "updated_at"]
    readonly_fields = ["tenant", "name", "created_at", "updated_at"]

    def has_add_permission(self, request):
        return False


@admin.register(ResourceShape)
class ResourceShapeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "pool",
        "cpu_millicores_min",
        "memory_mib_min",
        "gpu_count",
        "gpu_sharing_class",
    ]
    list_filter = ["pool", "gpu_sharing_class"]
    search_fields = ["name"]


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    """Who may submit at a class: listed tenants (none: all) and the minimum tenant role."""

    list_display = ["name", "value", "preemptible", "minimum_role"]
    list_filter = ["minimum_role"]
    filter_horizontal = ["allowed_tenants"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "pool",
        "cpu_millicores",
        "memory_mib",
        "gpus",
        "max_leases",
        "gpu_hours_per_period",
        "egress_mib",
        "period_days",
        "storage_mib",
    ]
    list_filter = ["pool"]


class CreditAccountForm(forms.ModelForm):
    """The balance changes only with a ledger row: a policy admin adds a top-up, never edits
    the balance."""

    top_up = forms.DecimalField(
        required=False, min_value=Decimal("0.0001"), max_digits=18, decimal_places=4
    )
    top_up_note = forms.CharField(required=False, max_length=150)

    class Meta:
        model = CreditAccount
        fields = ["tenant", "pool"]


class CreditChargeInline(admin.TabularInline):
    model = CreditCharge
    extra = 0
    can_delete = False
    fields = [
        "created_at",
        "kind",
        "amount",
        "balance_after",
        "lease_id",
        "period_start",
        "period_end",
        "priority_class",
        "note",
    ]
    readonly_fields = fields
    ordering = ["-created_at", "-id"]
    max_num = 0

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(CreditAccount)
class CreditAccountAdmin(admin.ModelAdmin):
    form = CreditAccountForm
    list_display = ["tenant", "pool", "balance", "updated_at"]
    list_filter = ["pool"]
    readonly_fields = ["balance", "created_at", "updated_at"]
    inlines = [CreditChargeInline]

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "tenant", "pool"] if obj else self.readonly_fields

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        amount = form.cleaned_data.get("top_up")
        if amount:
            by = Actor.from_request(request).label
            services.credit_top_up(
                obj, amount, by=by, note=form.cleaned_data.get("top_up_note") or ""
            )


@admin.register(CreditCharge)
class CreditChargeAdmin(admin.ModelAdmin):
    """The ledger: read-only, append-only (charges by the charger, top-ups on the account)."""

    list_display = ["created_at", "account", "kind", "amount", "balance_after", "lease_id"]
    list_filter = ["kind", "account__pool"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in CreditCharge._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AllowedRegistry)
class AllowedRegistryAdmin(admin.ModelAdmin):
    list_display = ["prefix", "pool", "require_digest"]


class PolicyVersionInline(admin.TabularInline):
    model = SchedulingPolicyVersion
    extra = 0
    can_delete = False
    readonly_fields = ["number", "weights", "knobs", "comment", "created_by", "created_at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(SchedulingPolicy)
class SchedulingPolicyAdmin(admin.ModelAdmin):
    list_display = ["pool", "created_at"]
    inlines = [PolicyVersionInline]


class PolicyVersionForm(forms.ModelForm):
    """Weights and knobs get the same checks as the API (pools.knobs.policy_version)."""

    class Meta:
        model = SchedulingPolicyVersion
        fields = ["policy", "weights", "knobs", "comment"]

    def clean(self):
        cleaned = super().clean()
        if "weights" in cleaned and "knobs" in cleaned:  # else the field already has an error
            knobs.policy_version(cleaned["weights"], cleaned["knobs"] or {})
        return cleaned


@admin.register(SchedulingPolicyVersion)
class SchedulingPolicyVersionAdmin(admin.ModelAdmin):
    """Adding here publishes the next number; existing versions are read-only."""

    form = PolicyVersionForm
    list_display = ["policy", "number", "comment", "created_by", "created_at"]
    fields = ["policy", "weights", "knobs", "comment"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields if obj else []

    def save_model(self, request, obj, form, change):
        version = policy_version_publish(
            policy=obj.policy,
            weights=obj.weights,
            knobs=obj.knobs,
            comment=obj.comment,
            actor=Actor.from_request(request),
        )
        obj.pk, obj.number = version.pk, version.number

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role"]
