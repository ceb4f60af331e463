"""The trace exported over OTLP/HTTP when a job ends, to a real local HTTP server that decodes
the protobuf POST on /v1/traces."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from config.builders import submit_job
from jobs import trace
from jobs.services import job_cancel
from observability import tracing
from pools.actors import Actor


@pytest.fixture
def collector():
    received: list[tuple[str, ExportTraceServiceRequest]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append((self.path, request))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.received = received
    yield server
    server.shutdown()
    server.server_close()


def test_a_job_that_ends_exports_its_stored_spans(
    collector, pool, tenant, member, django_capture_on_commit_callbacks
):
    job = submit_job(pool, tenant)
    endpoint = f"http://127.0.0.1:{collector.server_port}"
    with (
        override_settings(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
        django_capture_on_commit_callbacks(execute=True),
    ):
        job_cancel(job=job, actor=Actor.for_user(member))
    ((path, request),) = collector.received
    assert path == "/v1/traces"
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    stored = trace.job_spans(job, job.events.order_by("at", "id"))
    assert [s.name for s in spans] == ["job", "job.submit", "job.scheduling", "job.end"]
    assert [s.span_id.hex() for s in spans] == [s.span_id for s in stored]
    assert {s.trace_id.hex() for s in spans} == {job.trace_id}
    root = spans[0]
    assert all(s.parent_span_id.hex() == root.span_id.hex() for s in spans[1:])
    assert [s.start_time_unix_nano for s in spans] == [tracing._nanos(s.start) for s in stored]
    assert spans[2].end_time_unix_nano == spans[3].start_time_unix_nano  # they abut
    attributes = {a.key: a.value for a in spans[1].attributes}
    assert attributes["computepool.job"].int_value == job.pk
    service = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert service["service.name"] == "compute-pool"


def test_without_an_endpoint_nothing_is_exported(
    collector, pool, tenant, member, django_capture_on_commit_callbacks
):
    job = submit_job(pool, tenant)
    with (
        override_settings(OTEL_EXPORTER_OTLP_ENDPOINT=""),
        django_capture_on_commit_callbacks(execute=True),
    ):
        job_cancel(job=job, actor=Actor.for_user(member))
    assert collector.received == []
    assert tracing.export_job(job.pk, endpoint="") == 0


def test_a_collector_that_refuses_is_an_error(pool, tenant, member):
    job = submit_job(pool, tenant)
    job_cancel(job=job, actor=Actor.for_user(member))
    with pytest.raises(tracing.ExportFailed):
        tracing.export_job(job.pk, endpoint="http://127.0.0.1:9", timeout=1)
