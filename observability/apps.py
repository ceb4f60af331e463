from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Metrics, traces and logs of the control plane (docs/observability.md)."""

    name = "observability"
    verbose_name = "Observability"

    def ready(self):
        # `process`: each process's own metrics (the request timing middleware's histogram, the
        # Celery signals that time tasks); one trace per job, exported when the job ends
        # (observability/tracing.py)
        from jobs.signals import job_ended

        from . import process  # noqa: F401
        from .tracing import on_job_ended

        job_ended.connect(on_job_ended, dispatch_uid="observability.export_job_trace")
