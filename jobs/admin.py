"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from pools.roles import is_policy_admin

from .models import Job, JobEvent, TenantRetention


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "tenant", "pool", "state", "created_at"]
    list_filter = ["state", "pool"]
    readonly_fields = ["state", "state_changed_at"]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["at", "job", "from_state", "to_state", "reason", "actor_label"]


@admin.register(TenantRetention)
class TenantRetentionAdmin(admin.ModelAdmin):
    """Tenants' own retention of outputs and logs (jobs/retention.py), shown to policy admins
    beside the pools' knobs; tenant admins set it through /api/v1/output-retention/."""

    list_display = ["tenant", "pool", "output_retention_days", "updated_at", "updated_by"]
    list_filter = ["pool"]

    def has_module_permission(self, request):
        return is_policy_admin(request.user) or super().has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return is_policy_admin(request.user) or super().has_view_permission(request, obj)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
