"""Admin: read-mostly views; state changes go through services, not forms."""

from django.contrib import admin

from .models import Job, JobEvent


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "tenant", "pool", "state", "created_at"]
    list_filter = ["state", "pool"]
    readonly_fields = ["state", "state_changed_at"]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["at", "job", "from_state", "to_state", "reason", "actor_label"]
