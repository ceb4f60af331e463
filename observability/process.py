"""What each server and Celery process measures about itself: its HTTP requests and its tasks.

prometheus-client's multiprocess mode: where PROMETHEUS_MULTIPROC_DIR is set (runstack sets it
for the stack's processes), every process writes its values to files there and /metrics sums
them over all the processes of the host. Without it, /metrics shows its own process's.
Labels are bounded: the URL pattern (never the path itself), the method, the status code; the
task's name and outcome."""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from celery import signals
from prometheus_client import Histogram

from . import catalogue as m

HTTP_REQUEST_DURATION = Histogram(
    m.PREFIX + "http_request_duration_seconds",
    "Seconds to answer an HTTP request, by method, URL pattern and status.",
    ("method", "route", "status"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
TASK_DURATION = Histogram(
    m.PREFIX + "celery_task_duration_seconds",
    "Seconds a Celery task ran, by task and outcome (SUCCESS, FAILURE, RETRY …).",
    ("task", "outcome"),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _observe_request(request, response, started: float) -> None:
    match = getattr(request, "resolver_match", None)
    route = match.route if match is not None and match.route else "unmatched"
    method = request.method if request.method in METHODS else "other"
    HTTP_REQUEST_DURATION.labels(method, route, str(response.status_code)).observe(
        time.perf_counter() - started
    )


class RequestMetricsMiddleware:
    """Times every request, sync or async (the ASGI server runs both kinds of view)."""

    sync_capable = async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        response = self.get_response(request)
        _observe_request(request, response, started)
        return response

    async def _acall(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        _observe_request(request, response, started)
        return response


_task_started: dict[str, float] = {}


@signals.task_prerun.connect(dispatch_uid="observability.task_started")
def _task_started_at(task_id=None, **kwargs):
    _task_started[task_id] = time.perf_counter()


@signals.task_postrun.connect(dispatch_uid="observability.task_ended")
def _task_ended(task_id=None, task=None, state=None, **kwargs):
    started = _task_started.pop(task_id, None)
    if started is not None and task is not None:
        TASK_DURATION.labels(task.name, state or "unknown").observe(time.perf_counter() - started)
