"""The agent's log lines (docs/observability.md, "Logs"): structlog's ProcessorFormatter on the
standard library's root handler, so every `logging.getLogger(__name__)` line of the agent (and of
the libraries it uses) is rendered alike:

- `json`: one JSON object per line: `timestamp` (ISO 8601, UTC), `level`, `logger`, `event` (the
  message); a line logged by a job's runner thread also `job`, `attempt` and, when its
  assignment carries a valid W3C `traceparent`, `trace_id`; a line logged during a call to the
  control plane its `request_id` (the call's X-Request-ID, which the control plane's lines of
  that request carry too); `exception` when there is one;
- `console`: the same for people.

`auto` (the default): console when stderr is a terminal, JSON otherwise (a service manager, a
log collector). Nothing here imports the control plane.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
import uuid
from contextvars import ContextVar

import structlog
from requests.adapters import HTTPAdapter

FORMATS = ("auto", "json", "console")
REQUEST_ID_HEADER = "X-Request-ID"
# W3C Trace Context, version 00: version-traceid-parentid-flags, lowercase hex
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
FIRST_KEYS = ("timestamp", "level", "logger", "event")

# the id of the call to the control plane under way in this thread (its X-Request-ID)
request_id: ContextVar[str] = ContextVar("worker_agent_request_id", default="")


def valid_traceparent(traceparent) -> str:
    """`traceparent` when it is a valid W3C one (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase, ids
    not all zeros, nothing around it), else "": anything else (not a string, malformed, a
    newline that `requests` would refuse as a header) is never sent nor logged."""
    if not isinstance(traceparent, str):
        return ""
    found = TRACEPARENT.fullmatch(traceparent)
    if found is None or found.group(1) == "0" * 32 or found.group(2) == "0" * 16:
        return ""
    return traceparent


def trace_id_of(traceparent) -> str:
    """The trace id of a valid W3C `traceparent` (valid_traceparent), else ""."""
    return valid_traceparent(traceparent)[3:35]


def add_job_context(_logger, _method, event_dict: dict) -> dict:
    """The job of the runner thread that logs the line (worker_agent/runner.py: one thread per
    assignment, holding it as `assignment`), and the call to the control plane under way."""
    assignment = getattr(threading.current_thread(), "assignment", None)
    if assignment is not None:
        job = getattr(assignment, "job", None)
        if job is not None:
            event_dict.setdefault("job", job)
            event_dict.setdefault("attempt", getattr(assignment, "attempt", None))
        trace_id = trace_id_of(getattr(assignment, "traceparent", ""))
        if trace_id:
            event_dict.setdefault("trace_id", trace_id)
    current = request_id.get()
    if current:
        event_dict.setdefault("request_id", current)
    return event_dict


def leading_keys(_logger, _method, event_dict: dict) -> dict:
    first = {key: event_dict.pop(key) for key in FIRST_KEYS if key in event_dict}
    return first | event_dict


def resolve_format(format_name: str, stream=None) -> str:
    format_name = (format_name or "auto").lower()
    if format_name not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {format_name!r}")
    if format_name == "auto":
        stream = stream if stream is not None else sys.stderr
        return "console" if getattr(stream, "isatty", lambda: False)() else "json"
    return format_name


def formatter(format_name: str) -> structlog.stdlib.ProcessorFormatter:
    shared = [
        add_job_context,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    final = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if format_name == "json":
        final += [
            structlog.processors.format_exc_info,
            leading_keys,
            structlog.processors.JSONRenderer(),
        ]
    else:
        final.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    return structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=final)


def configure(level: str | int = "INFO", format_name: str = "auto", stream=None) -> str:
    """The root logger's one handler (on `stream`, default stderr) with the agent's formatter;
    returns the format chosen."""
    stream = stream if stream is not None else sys.stderr
    chosen = resolve_format(format_name, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(chosen))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    if isinstance(level, str):
        level = getattr(logging, level.upper(), logging.INFO)
    root.setLevel(level)
    return chosen


def new_request_id() -> str:
    return uuid.uuid4().hex


def with_request_id(call):
    """A call to the control plane, retries included, under one request id (bound for the log
    lines of the call; RequestIdAdapter sends it as X-Request-ID)."""

    @functools.wraps(call)
    def bound(*args, **kwargs):
        if request_id.get():
            return call(*args, **kwargs)
        token = request_id.set(new_request_id())
        try:
            return call(*args, **kwargs)
        finally:
            request_id.reset(token)

    return bound


class RequestIdAdapter(HTTPAdapter):
    """requests' adapter that sends the call's request id (a new one outside a call) as
    X-Request-ID, so the control plane's lines of the request join the agent's."""

    def send(self, request, *args, **kwargs):
        if REQUEST_ID_HEADER not in request.headers:
            request.headers[REQUEST_ID_HEADER] = request_id.get() or new_request_id()
        return super().send(request, *args, **kwargs)


def mount_request_ids(session) -> None:
    adapter = RequestIdAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
