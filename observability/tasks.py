"""The observability app's Celery tasks."""

from celery import shared_task

from . import fold as metrics_fold


@shared_task(name="observability.fold")
def fold() -> dict[str, int]:
    """The event log's new rows folded into the metrics (observability/fold.py)."""
    return metrics_fold.fold()
