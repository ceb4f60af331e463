from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self):
        from . import receivers  # noqa: F401  (a cancel calls its pending preemption off)
