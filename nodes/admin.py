"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from .models import GpuDevice, Node, NodeEvent


class GpuInline(admin.TabularInline):
    model = GpuDevice
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "state", "cpu_millicores_allocatable", "memory_mib_allocatable"]
    list_filter = ["pool", "state"]
    readonly_fields = ["state", "state_changed_at"]
    inlines = [GpuInline]


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node", "from_state", "to_state", "reason", "actor_label"]
    list_filter = ["reason"]
