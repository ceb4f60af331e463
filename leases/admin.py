"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from .models import Lease, LeaseEvent


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "node", "state", "expires_at"]
    list_filter = ["state", "pool"]
    readonly_fields = ["state", "state_changed_at", "fencing_token"]


@admin.register(LeaseEvent)
class LeaseEventAdmin(admin.ModelAdmin):
    list_display = ["at", "lease", "from_state", "to_state", "reason", "actor_label"]
