"""Span derivation (jobs/trace.py), pure over event rows, and the W3C traceparent rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from jobs import trace

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@dataclass
class Row:
    id: int
    at: datetime
    from_state: str
    to_state: str
    reason: str
    data: dict = field(default_factory=dict)


@dataclass
class JobRow:
    pk: int = 7
    trace_id: str = TRACE
    parent_span_id: str = ""
    created_at: datetime = T0


def events(*steps):
    """(seconds after T0, from, to, reason[, data]) → rows with ids in order."""
    return [
        Row(i + 1, T0 + timedelta(seconds=s), f, t, r, *(extra or [{}]))
        for i, (s, f, t, r, *extra) in enumerate(steps)
    ]


A_RUN = (
    (0.1, "", "queued", "submitted"),
    (2, "queued", "leased", "placed", {"node": "n1", "lease": 4, "policy_version": 3}),
    (3, "leased", "leased", "image_pulling"),
    (5, "leased", "leased", "image_pulled", {"pull_seconds": 2}),
    (5.2, "leased", "starting", "startup_began"),
    (6, "starting", "running", "container_started"),
    (16, "running", "running", "results_uploaded"),
    (17, "running", "succeeded", "exited_zero"),
)


def names(spans):
    return [(s.name, s.attempt) for s in spans]


def test_a_run_gives_every_step_in_order_each_abutting_the_next():
    spans = trace.job_spans(JobRow(), events(*A_RUN), {4: {"gpus": ["GPU-1"]}})
    assert names(spans) == [
        ("job", 1),
        ("submit", 0),
        ("scheduling", 0),
        ("node_admission", 1),
        ("image_pull", 1),
        ("container_start", 1),
        ("running", 1),
        ("result_upload", 1),
        ("end", 1),
    ]
    steps = spans[1:]
    for before, after in pairwise(steps):
        assert before.end == after.start, (before.name, after.name)
    durations = {s.name: s.duration_s for s in spans}
    assert durations == {
        "job": 17.0,
        "submit": 0.1,
        "scheduling": 1.9,
        "node_admission": 1.0,
        "image_pull": 2.0,
        "container_start": 1.0,
        "running": 10.0,
        "result_upload": 1.0,
        "end": 0.0,
    }
    assert all(s.status == "ok" for s in spans)
    assert spans[3].infrastructure == {
        "node": "n1",
        "lease": 4,
        "gpus": ["GPU-1"],
        "policy_version": 3,
    }
    assert all(s.parent_span_id == spans[0].span_id for s in steps)
    assert spans[0].parent_span_id == ""


def test_span_ids_are_derived_alike_on_every_read_and_unique():
    first = trace.job_spans(JobRow(), events(*A_RUN))
    again = trace.job_spans(JobRow(), events(*A_RUN))
    assert [s.span_id for s in first] == [s.span_id for s in again]
    ids = [s.span_id for s in first]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 16 and int(i, 16) for i in ids)
    assert first[0].span_id == trace.root_span_id(TRACE, 7)
    other = trace.job_spans(JobRow(trace_id="1" * 32), events(*A_RUN))
    assert not set(ids) & {s.span_id for s in other}


def test_a_retried_attempt_has_its_own_spans_and_the_failed_one_is_an_error():
    rows = events(
        (0, "", "queued", "submitted"),
        (1, "queued", "leased", "placed", {"node": "n1", "lease": 4}),
        (1.5, "leased", "starting", "startup_began"),
        (2, "starting", "running", "container_started"),
        (3, "running", "queued", "retry_scheduled", {"failure": "exited_nonzero"}),
        (9, "queued", "leased", "placed", {"node": "n2", "lease": 5}),
        (9.5, "leased", "starting", "startup_began"),
        (10, "starting", "running", "container_started"),
        (12, "running", "failed", "exited_nonzero"),
    )
    spans = trace.job_spans(JobRow(), rows)
    assert names(spans) == [
        ("job", 2),
        ("submit", 0),
        ("scheduling", 0),
        ("node_admission", 1),
        ("container_start", 1),
        ("running", 1),
        ("scheduling", 1),
        ("node_admission", 2),
        ("container_start", 2),
        ("running", 2),
        ("end", 2),
    ]
    by_position = [s.status for s in spans]
    assert by_position[5] == "error"  # the first attempt's run failed
    assert by_position[9] == "error" and by_position[10] == "error" and spans[0].status == "error"
    assert spans[7].infrastructure["node"] == "n2"
    steps = spans[1:]
    assert all(a.end == b.start for a, b in pairwise(steps))


def test_a_job_still_running_has_its_last_span_open_and_no_end():
    spans = trace.job_spans(JobRow(), events(*A_RUN[:6]))
    assert spans[-1].name == "running" and spans[-1].end is None
    assert spans[0].end is None and spans[0].status == "unset"


def test_a_cancelled_queued_job_ends_without_an_error():
    rows = events((0, "", "queued", "submitted"), (4, "queued", "cancelled", "cancelled_by_user"))
    spans = trace.job_spans(JobRow(), rows)
    assert names(spans) == [("job", 0), ("submit", 0), ("scheduling", 0), ("end", 0)]
    assert spans[-1].status == "unset" and spans[2].duration_s == 4


def test_events_after_the_end_are_not_spans():
    rows = events(*A_RUN, (99, "succeeded", "succeeded", "artifacts_expired"))
    assert trace.job_spans(JobRow(), rows)[0].duration_s == 17


def test_a_clients_parent_span_is_the_jobs_parent():
    spans = trace.job_spans(JobRow(parent_span_id="00f067aa0ba902b7"), events(*A_RUN))
    assert spans[0].parent_span_id == "00f067aa0ba902b7"


def test_the_api_shape_hides_the_infrastructure_from_tenants():
    spans = trace.job_spans(JobRow(), events(*A_RUN))
    tenant = trace.span_dict(spans[3], infrastructure=False)
    operator = trace.span_dict(spans[3], infrastructure=True)
    assert "attributes" not in tenant and "n1" not in str(tenant)
    assert operator["attributes"]["node"] == "n1"
    assert tenant["duration_s"] == 1.0 and tenant["status"] == "ok"


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        ),
        (  # a later version may carry more after the flags
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra",
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
        ),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", None),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None),
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", None),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_traceparent_parsing_follows_w3c(header, parsed):
    assert trace.parse_traceparent(header) == parsed
