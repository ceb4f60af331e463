"""Policy admins edit the catalogue here. Policy versions are immutable: edit = new version."""

import hashlib
import json
import math
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from placement.registry import SCORERS

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
from .statemachine import Refusal


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


# --- policy versions: weights in their own units, a new version from a copy of the current one,
# and its differences from it shown before it is published -------------------------------------

SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def weight_text(value) -> str:
    """A scorer weight as people read it: 10⁹, 2.5 × 10⁶, 1, 0.5 (0: off). The default's
    weights are powers of ten that make the order lexicographic (placement/policy.py)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return repr(value)
    if value == 0:
        return "0 (off)"
    if 0.01 <= value < 1000:
        return f"{value:g}"
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10**exponent, 6)
    power = "10" + str(exponent).translate(SUPERSCRIPT)
    return power if mantissa == 1 else f"{mantissa:g} × {power}"


def scorer_meaning(name: str) -> str:
    """What a scorer scores, in its own scale: its docstring's first line (the registry's)."""
    scorer = SCORERS.get(name)
    doc = (scorer.score.__doc__ or "").strip().splitlines() if scorer else []
    return doc[0] if doc else ("not a registered scorer" if scorer is None else "")


def weight_rows(weights: dict) -> list[dict]:
    """The weights, heaviest first: each scorer, its weight as text, its rank (1 decides first;
    equal weights share a rank), what it scores."""
    ordered = sorted(weights.items(), key=lambda item: (-_number(item[1]), item[0]))
    ranks = {
        value: rank
        for rank, value in enumerate(sorted({_number(v) for _, v in ordered}, reverse=True), 1)
    }
    return [
        {
            "name": name,
            "weight": weight_text(value),
            "raw": value,
            "rank": ranks[_number(value)],
            "meaning": scorer_meaning(name),
        }
        for name, value in ordered
    ]


def _number(value) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def policy_diff(current, weights: dict, knobs: dict) -> list[dict]:
    """What a new version changes against `current` (a version, or None): one row per weight or
    knob added, removed or changed, `{"kind", "name", "before", "after", "change"}`."""
    rows = []
    before_sets = (
        ("weight", dict(current.weights) if current else {}, weights, weight_text),
        ("knob", dict(current.knobs or {}) if current else {}, knobs, _knob_text),
    )
    for kind, before, after, text in before_sets:
        for name in sorted(set(before) | set(after)):
            if name in before and name in after and before[name] == after[name]:
                continue
            change = (
                "added" if name not in before else "removed" if name not in after else "changed"
            )
            rows.append(
                {
                    "kind": kind,
                    "name": name,
                    "before": text(before[name]) if name in before else "—",
                    "after": text(after[name])
                    if name in after
                    else "— (default)"
                    if kind == "knob"
                    else "—",
                    "change": change,
                }
            )
    return rows


def _knob_text(value) -> str:
    return json.dumps(value, sort_keys=True)


def weights_table(weights) -> str:
    """The weights as an HTML table for the admin (read-only views)."""
    if not isinstance(weights, dict) or not weights:
        return "—"
    return render_to_string("admin/pools/_weights.html", {"rows": weight_rows(weights)})


class WeightsField(forms.CharField):
    """Scorer weights, one per line, `name = weight`, the weight written as people write it
    (`1e9`, `10^9`, `2.5e6`, `1 000`, `0.5`); JSON (`{"name": weight}`) is accepted too."""

    widget = forms.Textarea(attrs={"rows": 10, "cols": 40, "class": "vLargeTextField"})

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{name} = {_compact(v)}" for name, v in value.items())
        return value

    def to_python(self, value):
        text = (super().to_python(value) or "").strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except ValueError as exc:
                raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        weights, problems = {}, []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, raw = line.partition("=")
            try:
                if not sep:
                    raise ValueError
                weights[name.strip()] = _parse_weight(raw)
            except ValueError:
                problems.append(
                    f"Line {number}: write `scorer = weight` (e.g. `memory_fgd = 1e6`)."
                )
        if problems:
            raise forms.ValidationError(problems)
        return weights


def _compact(value) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1000:
        exponent = math.floor(math.log10(value))
        mantissa = round(value / 10**exponent, 6)
        return f"{mantissa:g}e{exponent}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _parse_weight(raw: str) -> int | float:
    text = raw.strip().replace(" ", "").replace("_", "").replace("×", "*")
    base, caret, exponent = text.partition("^")
    if caret:  # 10^9, 2.5*10^6
        factor, star, ten = base.rpartition("*")
        if ten != "10":
            raise ValueError(raw)
        value = (float(factor) if star else 1.0) * 10 ** int(exponent)
    else:
        value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


class PolicyVersionInline(admin.TabularInline):
    model = SchedulingPolicyVersion
    extra = 0
    can_delete = False
    fields = ["number", "weights_in_units", "knobs", "comment", "created_by", "created_at"]
    readonly_fields = fields

    @admin.display(description="weights")
    def weights_in_units(self, obj):
        return weights_table(obj.weights)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(SchedulingPolicy)
class SchedulingPolicyAdmin(admin.ModelAdmin):
    list_display = ["pool", "current_version", "new_version", "created_at"]
    inlines = [PolicyVersionInline]
    readonly_fields = ["created_at"]

    @admin.display(description="current version")
    def current_version(self, obj):
        current = obj.current
        return f"v{current.number}" if current else "—"

    @admin.display(description="")
    def new_version(self, obj):
        url = reverse("admin:pools_schedulingpolicyversion_add")
        return format_html(
            '<a href="{}?policy={}">New version from the current one</a>', url, obj.pk
        )


class PolicyVersionForm(forms.ModelForm):
    """Weights and knobs get the same checks as the API (pools.knobs.policy_version). Saving
    publishes only what was reviewed: the first save shows the differences from the policy's
    current version and asks again; the second publishes them, unless they changed meanwhile."""

    weights = WeightsField(help_text="One scorer per line: name = weight (e.g. memory_fgd = 1e6).")
    reviewed = forms.CharField(required=False, widget=forms.HiddenInput)

    class Meta:
        model = SchedulingPolicyVersion
        fields = ["policy", "weights", "knobs", "comment"]

    review: list | None = None
    current = None

    def clean(self):
        cleaned = super().clean()
        if "weights" not in cleaned or "knobs" not in cleaned or not cleaned.get("policy"):
            return cleaned  # the field already has an error
        weights, knob_values = cleaned["weights"], cleaned["knobs"] or {}
        knobs.policy_version(weights, knob_values)
        self.current = cleaned["policy"].current
        digest = hashlib.sha256(
            json.dumps(
                [cleaned["policy"].pk, self.current and self.current.pk, weights, knob_values],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()
        if cleaned.get("reviewed") != digest:
            self.review = policy_diff(self.current, weights, knob_values)
            self.data = self.data.copy()
            self.data[self.add_prefix("reviewed")] = digest
            version = f"version {self.current.number}" if self.current else "no version yet"
            raise forms.ValidationError(
                f"Review the differences from the current version ({version}) above, then "
                "save again to publish them."
            )
        return cleaned


@admin.register(SchedulingPolicyVersion)
class SchedulingPolicyVersionAdmin(admin.ModelAdmin):
    """Adding here publishes the next number, starting from a copy of the policy's current
    version (`?policy=`), after a review of the differences; existing versions are
    read-only."""

    form = PolicyVersionForm
    change_form_template = "admin/pools/schedulingpolicyversion/change_form.html"
    list_display = ["policy", "number", "comment", "created_by", "created_at"]

    def get_fields(self, request, obj=None):
        if obj:
            return ["policy", "number", "weights_in_units", "knobs", "comment", "created_by"]
        return ["policy", "weights", "knobs", "comment", "reviewed"]

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj) if obj else []

    @admin.display(description="weights")
    def weights_in_units(self, obj):
        return weights_table(obj.weights)

    def _chosen_policy(self, request):
        chosen = request.GET.get("policy", "")
        return SchedulingPolicy.objects.filter(pk=chosen).first() if chosen.isdigit() else None

    def get_changeform_initial_data(self, request):
        """A new version starts as a copy of its policy's current one."""
        initial = super().get_changeform_initial_data(request)
        policy = self._chosen_policy(request)
        if policy is not None:
            initial["policy"] = policy.pk
            if current := policy.current:
                initial["weights"] = dict(current.weights)
                initial["knobs"] = dict(current.knobs or {})
        return initial

    def add_view(self, request, form_url="", extra_context=None):
        """Without `?policy=`, first choose the policy whose current version to start from."""
        if request.method == "GET" and self._chosen_policy(request) is None:
            if not self.has_add_permission(request):
                raise PermissionDenied
            policies = SchedulingPolicy.objects.select_related("pool").order_by("pool__slug")
            context = {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": "New policy version: start from which policy?",
                "policies": [(p, p.current) for p in policies],
            }
            return TemplateResponse(
                request, "admin/pools/schedulingpolicyversion/choose_policy.html", context
            )
        extra = {**(extra_context or {})}
        if (policy := self._chosen_policy(request)) and (current := policy.current):
            extra["current_version"] = current
            extra["current_rows"] = weight_rows(current.weights)
        return super().add_view(request, form_url, extra)

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
    """Through the membership services, so each change writes its MembershipEvent and the
    tenant's last admin is kept (a refusal is shown, nothing changes)."""

    list_display = ["user", "tenant", "role"]

    def get_readonly_fields(self, request, obj=None):
        return ["user", "tenant"] if obj is not None else []  # a move is a remove and an add

    def save_model(self, request, obj, form, change):
        actor = Actor.for_user(request.user)
        try:
            if change:
                stored = Membership.objects.get(pk=obj.pk)  # `obj` holds the form's role already
                services.member_role_change(membership=stored, role=obj.role, actor=actor)
            else:
                services.membership_set(
                    user=obj.user, tenant=obj.tenant, role=obj.role, actor=actor
                )
        except Refusal as refusal:
            self.message_user(request, str(refusal), level=messages.ERROR)

    def delete_model(self, request, obj):
        try:
            services.member_remove(membership=obj, actor=Actor.for_user(request.user))
        except Refusal as refusal:
            self.message_user(request, str(refusal), level=messages.ERROR)

    def delete_queryset(self, request, queryset):
        for membership in queryset:
            self.delete_model(request, membership)
