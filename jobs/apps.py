from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from leases.signals import storage_statement
        from nodes.signals import capacity_vanished
        from storage.signals import volume_jobs

        from .receivers import on_capacity_vanished, on_storage_statement, on_volume_jobs

        capacity_vanished.connect(on_capacity_vanished, dispatch_uid="jobs.capacity_vanished")
        storage_statement.connect(on_storage_statement, dispatch_uid="jobs.storage_statement")
        volume_jobs.connect(on_volume_jobs, dispatch_uid="jobs.volume_jobs")
