"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from .models import Lease, LeaseEvent


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    """Read only: a lease is the ledger's record of what its node holds (capacity, devices,
    fencing token, state); only leases.services create and change one, with its event."""

    list_display = ["id", "tenant", "node", "state", "expires_at"]
    list_filter = ["state", "pool"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Lease._meta.fields]

    def has_add_permission(self, request):
        return False  # a lease added here would hold nothing on its node's ledger


@admin.register(LeaseEvent)
class LeaseEventAdmin(admin.ModelAdmin):
    list_display = ["at", "lease", "from_state", "to_state", "reason", "actor_label"]
