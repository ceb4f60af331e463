from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, traces and logs of the control plane (docs/observability.md)."""

    name = "observability"
    verbose_name = "Observability"
