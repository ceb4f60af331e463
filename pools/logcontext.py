"""What every log line of this process carries while it serves one request, task or job:
the request id and the trace id (docs/observability.md, "Logs"). Context variables, so a
thread or an asyncio task of its own sees only its own values."""

from __future__ import annotations

from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="")
trace_id: ContextVar[str] = ContextVar("trace_id", default="")
