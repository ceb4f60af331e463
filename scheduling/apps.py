from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self):
        # a cancel calls its pending preemption off; submits, ended leases and ready nodes
        # ask for a pass of their pool
        from . import receivers  # noqa: F401
