"""One trace per job (docs/observability.md "Traces"): the W3C trace context a job carries, and
its spans, derived from the job's stored events alone, so the trace survives without a
collector and every read of it agrees.

Pure: nothing here queries the database. `job_spans` takes the job's row and its events (any
objects with the attributes named below, in `(at, id)` order) and answers the spans in order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

# https://www.w3.org/TR/trace-context/#traceparent-header
_TRACEPARENT = re.compile(
    r"^(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<span_id>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})(?P<rest>-.*)?$"
)
ZERO_TRACE = "0" * 32
ZERO_SPAN = "0" * 16
TRACEPARENT_MAX_CHARS = 512


def parse_traceparent(value) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid W3C `traceparent` header, else None: a header that
    is absent, malformed, of version ff, with an all-zero id, or of version 00 with more after
    the flags. Per the recommendation, an invalid one is ignored (a new trace), never refused."""
    if not isinstance(value, str) or len(value) > TRACEPARENT_MAX_CHARS:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, span_id = match["version"], match["trace_id"], match["span_id"]
    if version == "ff" or (version == "00" and match["rest"]):
        return None
    if trace_id == ZERO_TRACE or span_id == ZERO_SPAN:
        return None
    return trace_id, span_id


def traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def span_id_for(trace_id: str, *parts) -> str:
    """A span id that every read derives alike: 16 hex from the trace id and what the span
    stands for (the job, an event id and the step's name), never all zeros."""
    digest = hashlib.sha256(":".join([trace_id, *map(str, parts)]).encode()).hexdigest()
    for start in range(0, len(digest) - 15, 16):
        if (candidate := digest[start : start + 16]) != ZERO_SPAN:
            return candidate
    return "0" * 15 + "1"  # pragma: no cover - sha256 would have to be all zeros


def root_span_id(trace_id: str, job_id: int) -> str:
    """The job's own span: the parent of every step's, and the agent's `traceparent`."""
    return span_id_for(trace_id, "job", job_id)


def job_traceparent(job) -> str:
    """What the job's node carries back on its reports and uploads (docs/data-plane.md)."""
    return traceparent(job.trace_id, root_span_id(job.trace_id, job.pk))


# --- spans --------------------------------------------------------------------------------

# the steps, in the order a run goes through them (docs/observability.md "Traces")
SUBMIT = "submit"
SCHEDULING = "scheduling"  # queued → leased: the scheduler's decision
ADMISSION = "node_admission"  # leased → the agent picked it up (its first report)
IMAGE_PULL = "image_pull"
CONTAINER_START = "container_start"
RUNNING = "running"
CHECKPOINT = "checkpoint"
RESULT_UPLOAD = "result_upload"
END = "end"
STEPS = (
    SUBMIT,
    SCHEDULING,
    ADMISSION,
    IMAGE_PULL,
    CONTAINER_START,
    RUNNING,
    CHECKPOINT,
    RESULT_UPLOAD,
    END,
)
JOB = "job"

OK, ERROR, UNSET = "ok", "error", "unset"
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})
# events that change no state yet mark a step (the others are read by their states)
_STEP_EVENTS = {
    "image_pulling": IMAGE_PULL,
    "image_pulled": CONTAINER_START,
    "results_uploaded": RESULT_UPLOAD,
}
# an attempt that went back to the queue for one of these did not fail
_NOT_FAILURES = frozenset({"checkpoint_done"})


@dataclass
class Span:
    name: str
    span_id: str
    parent_span_id: str
    start: datetime
    end: datetime | None  # None: still open (the job has not got past this step yet)
    status: str = UNSET
    attempt: int = 0
    # the event that opened the span and the one that closed it (reason codes)
    reason: str = ""
    end_reason: str = ""
    event_id: int | None = None
    # node, gpus, lease, policy_version: only operators are shown these (jobs/selectors.py)
    infrastructure: dict = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        return None if self.end is None else (self.end - self.start).total_seconds()


def job_spans(job, events: Iterable, leases: Mapping[int, Mapping] | None = None) -> list[Span]:
    """The job's spans in order: the job's own span first (submit to its end), then one per step
    of each attempt. Each step's span ends where the next one starts, so consecutive spans abut;
    a step the job skipped (no pull: the image was there) has no span. `job`: `pk`, `trace_id`,
    `parent_span_id`, `created_at`. `events`: `id`, `at`, `from_state`, `to_state`, `reason`,
    `data`, in `(at, id)` order. `leases`: {lease id: {"gpus": [...]}} for the operators'
    attributes."""
    leases = leases or {}
    trace_id = job.trace_id
    root_id = root_span_id(trace_id, job.pk)
    steps: list[Span] = []
    attempt, infrastructure = 0, {}

    def open_span(name: str, event, status: str = UNSET) -> None:
        at = event.at
        if steps and steps[-1].end is None:
            previous = steps[-1]
            # an event never goes back in time: a span never ends before it starts
            at = max(at, previous.start)
            previous.end, previous.end_reason = at, event.reason
        steps.append(
            Span(
                name=name,
                span_id=span_id_for(trace_id, event.id, name),
                parent_span_id=root_id,
                start=at,
                end=None,
                status=status,
                attempt=attempt,
                reason=event.reason,
                event_id=event.id,
                infrastructure=dict(infrastructure),
            )
        )

    def fail_open_span(status: str) -> None:
        if steps and steps[-1].end is None:
            steps[-1].status = status

    ended = None
    for event in events:
        if ended is not None:
            break  # artifacts expiring after the end are not part of the run
        to, reason = event.to_state, event.reason
        if not event.from_state and to == "queued":  # the submit
            submit = Span(
                name=SUBMIT,
                span_id=span_id_for(trace_id, event.id, SUBMIT),
                parent_span_id=root_id,
                start=min(job.created_at, event.at),
                end=event.at,
                status=OK,
                reason=reason,
                event_id=event.id,
            )
            steps.append(submit)
            open_span(SCHEDULING, event)
        elif to == "leased" and event.from_state == "queued":
            attempt += 1
            data = event.data or {}
            lease = data.get("lease")
            infrastructure = {
                key: value
                for key, value in (
                    ("node", data.get("node")),
                    ("lease", lease),
                    ("gpus", list((leases.get(lease) or {}).get("gpus") or [])),
                    ("policy_version", data.get("policy_version")),
                )
                if value not in (None, "", [])
            }
            if steps:
                steps[-1].status = OK
                steps[-1].infrastructure = dict(infrastructure)  # where it decided to put it
            open_span(ADMISSION, event)
        elif reason in _STEP_EVENTS and to not in TERMINAL_STATES:
            if reason == "image_pulled" and steps and steps[-1].name != IMAGE_PULL:
                continue  # a pull reported without its start: the start span goes on
            fail_open_span(OK)
            open_span(_STEP_EVENTS[reason], event)
        elif to == "starting":
            # the agent had the image already, or said only that it began the pull
            if steps and steps[-1].name in (ADMISSION, IMAGE_PULL):
                fail_open_span(OK)
                open_span(CONTAINER_START, event)
        elif to == "running":  # started, or back from a checkpoint called off
            fail_open_span(OK)
            open_span(RUNNING, event)
        elif to == "checkpointing":
            fail_open_span(OK)
            open_span(CHECKPOINT, event)
        elif to == "queued" and event.from_state:  # the attempt went back to the queue
            fail_open_span(OK if reason in _NOT_FAILURES else ERROR)
            infrastructure = {}
            open_span(SCHEDULING, event)
        elif to in TERMINAL_STATES:
            status = OK if to == "succeeded" else (UNSET if to == "cancelled" else ERROR)
            if steps and steps[-1].end is None and steps[-1].status == UNSET:
                steps[-1].status = OK if status == OK else status
            open_span(END, event, status)
            steps[-1].end = steps[-1].start  # the end is an instant
            ended = event
    root = Span(
        name=JOB,
        span_id=root_id,
        parent_span_id=job.parent_span_id or "",
        start=steps[0].start if steps else job.created_at,
        end=ended.at if ended is not None else None,
        status=steps[-1].status if ended is not None else UNSET,
        attempt=attempt,
        reason=steps[0].reason if steps else "",
        end_reason=ended.reason if ended is not None else "",
        event_id=steps[0].event_id if steps else None,
        infrastructure=dict(infrastructure),
    )
    if root.end is not None and root.end < root.start:
        root.end = root.start
    return [root, *steps]


def span_dict(span: Span, *, infrastructure: bool) -> dict:
    """A span as the API shows it; `infrastructure` (operators only) adds where it ran."""
    body = {
        "name": span.name,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "start": span.start.isoformat(),
        "end": span.end.isoformat() if span.end is not None else None,
        "duration_s": round(span.duration_s, 6) if span.duration_s is not None else None,
        "status": span.status,
        "attempt": span.attempt,
        "reason": span.reason,
        "end_reason": span.end_reason,
    }
    if infrastructure:
        body["attributes"] = dict(span.infrastructure)
    return body
