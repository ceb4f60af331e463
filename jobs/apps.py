from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from nodes.signals import capacity_vanished

        from .receivers import on_capacity_vanished

        capacity_vanished.connect(on_capacity_vanished, dispatch_uid="jobs.capacity_vanished")
