from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"
    verbose_name = "Pools, tenants and policy"

    def ready(self):
        from . import encryption  # noqa: F401  (registers the key ring's system checks)
