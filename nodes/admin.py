"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from .models import EnrollmentToken, GpuDevice, Node, NodeCredential, NodeEvent, NodeProbe

# The capacity ledger: changed only by the guarded UPDATEs of leases.services, never by a form
# (an edit would make the ledger disagree with the leases it sums).
NODE_LEDGER_FIELDS = ["cpu_millicores_reserved", "memory_mib_reserved", "scratch_mib_reserved"]
GPU_LEDGER_FIELDS = ["milli_reserved", "mig_slots_used", "share_tenant"]


class GpuInline(admin.TabularInline):
    model = GpuDevice
    extra = 0
    readonly_fields = GPU_LEDGER_FIELDS


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "state", "cpu_millicores_allocatable", "memory_mib_allocatable"]
    list_filter = ["pool", "state"]
    readonly_fields = ["state", "state_changed_at", *NODE_LEDGER_FIELDS]
    inlines = [GpuInline]


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node", "from_state", "to_state", "reason", "actor_label"]
    list_filter = ["reason"]


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    """Tokens are issued through the API (the secret is shown once); here they are read."""

    list_display = ["prefix", "pool", "name", "uses", "max_uses", "expires_at", "revoked_at"]
    readonly_fields = ["digest", "prefix", "uses"]


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    list_display = ["prefix", "node", "created_at", "expires_at", "valid_until", "revoked_at"]
    readonly_fields = ["digest", "prefix", "replaced_by"]


@admin.register(NodeProbe)
class NodeProbeAdmin(admin.ModelAdmin):
    list_display = ["pk", "node", "kind", "state", "requested_at", "completed_at"]
    list_filter = ["kind", "state"]
