"""A job's trace exported over OTLP/HTTP (docs/observability.md "Traces").

The spans are the stored ones (jobs/trace.py, derived from the job's events), with their ids
and times: when a job ends (jobs.signals.job_ended, on commit), the Celery task
`observability.export_job_trace` builds them as the OpenTelemetry SDK's ReadableSpan objects and
hands them to its OTLPSpanExporter. Without `OTEL_EXPORTER_OTLP_ENDPOINT` nothing is exported:
the trace stays in the database and `GET /api/v1/jobs/{id}/trace` serves it.
"""

from __future__ import annotations

import logging
import os

from celery import shared_task
from django.conf import settings
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from jobs import trace as job_trace
from jobs.models import Job
from jobs.selectors import job_trace_spans

logger = logging.getLogger(__name__)

SERVICE_NAME = "compute-pool"
SCOPE = InstrumentationScope("computepool.jobs")
_STATUS = {
    job_trace.OK: StatusCode.OK,
    job_trace.ERROR: StatusCode.ERROR,
    job_trace.UNSET: StatusCode.UNSET,
}


def otlp_endpoint() -> str:
    """The collector's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`, a setting or the process's
    environment); spans go to `<it>/v1/traces`. "": nothing is exported."""
    value = getattr(settings, "OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if value is None:
        value = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    return str(value or "").strip()


def _nanos(moment) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000


def readable_spans(job: Job, spans=None) -> list[ReadableSpan]:
    """The job's stored spans as the SDK's ReadableSpan, with their own ids and times; a span
    still open (the job has not ended) is left out. Every attribute is included: the collector
    is the operators'."""
    spans = job_trace_spans(job) if spans is None else spans
    trace_id = int(job.trace_id, 16)
    flags = TraceFlags(TraceFlags.SAMPLED)
    resource = Resource.create(
        {
            "service.name": getattr(settings, "OTEL_SERVICE_NAME", "") or SERVICE_NAME,
        }
    )

    def context(span_id: str, remote: bool = False) -> SpanContext:
        return SpanContext(trace_id, int(span_id, 16), is_remote=remote, trace_flags=flags)

    readable = []
    for span in spans:
        if span.end is None:
            continue
        attributes = {
            "computepool.job": job.pk,
            "computepool.tenant": job.tenant.slug,
            "computepool.pool": job.pool.slug,
            "computepool.step": span.name,
            "computepool.attempt": span.attempt,
            "computepool.reason": span.reason,
            "computepool.end_reason": span.end_reason,
        }
        for key, value in span.infrastructure.items():
            if isinstance(value, list):
                value = [str(item) for item in value]
            attributes[f"computepool.{key}"] = value
        parent = None
        if span.parent_span_id:
            # the job's own span's parent is the client's span (a remote one)
            parent = context(span.parent_span_id, remote=span.name == job_trace.JOB)
        readable.append(
            ReadableSpan(
                name=f"job.{span.name}" if span.name != job_trace.JOB else "job",
                context=context(span.span_id),
                parent=parent,
                resource=resource,
                attributes={k: v for k, v in attributes.items() if v not in (None, "")},
                kind=SpanKind.INTERNAL,
                status=Status(_STATUS.get(span.status, StatusCode.UNSET)),
                start_time=_nanos(span.start),
                end_time=_nanos(span.end),
                instrumentation_scope=SCOPE,
            )
        )
    return readable


def export_job(job_id: int, endpoint: str | None = None, timeout: float = 10) -> int:
    """Export the ended job's spans to `<endpoint>/v1/traces` (OTLP/HTTP, protobuf); how many
    were sent (0: no endpoint, or no such job). Raises when the collector refuses them."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = otlp_endpoint() if endpoint is None else endpoint
    if not endpoint:
        return 0
    job = Job.objects.select_related("tenant", "pool").filter(pk=job_id).first()
    if job is None:
        return 0
    spans = readable_spans(job)
    if not spans:
        return 0
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces", timeout=timeout)
    try:
        result = exporter.export(spans)
    finally:
        exporter.shutdown()
    if result != SpanExportResult.SUCCESS:
        raise ExportFailed(f"the collector at {endpoint} did not take job {job_id}'s trace")
    return len(spans)


class ExportFailed(Exception):
    pass


@shared_task(
    name="observability.export_job_trace",
    autoretry_for=(ExportFailed,),
    retry_backoff=True,
    max_retries=5,
)
def export_job_trace(job_id: int) -> int:
    """A job ended: its trace to the collector, when there is one."""
    return export_job(int(job_id))


def on_job_ended(sender, *, job_id: int, **_) -> None:
    """jobs.signals.job_ended (after the commit): the export is queued only where a collector
    is configured, so a deployment without one sends no task."""
    if not otlp_endpoint():
        return
    try:
        export_job_trace.delay(job_id)
    except Exception:  # the broker is down: the trace stays stored, the job's end stands
        logger.warning("job %s: trace export not queued", job_id, exc_info=True)
