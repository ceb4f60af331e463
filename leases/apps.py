from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "leases"
    verbose_name = "Leases and the capacity ledger"

    def ready(self):
        from . import receivers  # noqa: F401  (connects the ledger to node events)
