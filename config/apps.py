from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class ProjectConfig(AppConfig):
    """Project-wide management commands (run the stack, load the demo) and health."""

    name = "config"
    verbose_name = "Compute Pool"

    def ready(self):
        from . import schema  # noqa: F401  (registers the OpenAPI auth extensions)


class PolicyAdminConfig(AdminConfig):
    default_site = "config.admin_site.PolicyAdminSite"
