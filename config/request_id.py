"""The request id and the trace id of every log line logged while a request is served
(docs/observability.md, "Logs").

The request id is the client's `X-Request-ID` when it is sane (1 to 128 characters of
`A-Z a-z 0-9 - _ . : + / = @`), else a new one (uuid4, hex): a client's bytes never reach a log
line otherwise. It is returned in the response's `X-Request-ID` and bound to
pools.logcontext.request_id while the request is served; a valid W3C `traceparent` header binds
its trace id to pools.logcontext.trace_id likewise. Both are reset when the response is made.

First in MIDDLEWARE, so that what every other middleware logs or answers has them. Cheap on
purpose (a header read, a regular expression, two context variables): no line is logged per
request here. Sync and async: under the ASGI server it runs in whichever mode the chain below it
has, and never costs a thread switch of its own.
"""

from __future__ import annotations

import re
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from pools import logcontext

HEADER = "X-Request-ID"
META_KEY = "HTTP_X_REQUEST_ID"
REQUEST_ID = re.compile(r"[A-Za-z0-9\-_.:+/=@]{1,128}")
# version-traceid-parentid-flags; a future version may append fields after a dash (W3C Trace
# Context, "Versioning of traceparent"); version ff and all-zero ids are invalid
TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
ZERO_TRACE, ZERO_PARENT = "0" * 32, "0" * 16


def request_id_from(value: str | None) -> str:
    """The client's request id when it is sane, else a new one."""
    if value and REQUEST_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def trace_id_from(traceparent: str | None) -> str:
    """The trace id of a valid W3C `traceparent` header, else ""."""
    if not traceparent or len(traceparent) > 512:
        return ""
    found = TRACEPARENT.fullmatch(traceparent.strip())
    if found is None:
        return ""
    version, trace_id, parent_id, _flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == ZERO_TRACE:
        return ""
    if parent_id == ZERO_PARENT:
        return ""
    return trace_id


class RequestIdMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _bind(self, request):
        request.request_id = request_id = request_id_from(request.META.get(META_KEY))
        tokens = [(logcontext.request_id, logcontext.request_id.set(request_id))]
        trace_id = trace_id_from(request.META.get("HTTP_TRACEPARENT"))
        if trace_id:
            tokens.append((logcontext.trace_id, logcontext.trace_id.set(trace_id)))
        return tokens

    @staticmethod
    def _reset(tokens) -> None:
        for var, token in reversed(tokens):
            var.reset(token)

    def __call__(self, request):
        if self.is_async:
            return self.__acall__(request)
        tokens = self._bind(request)
        try:
            response = self.get_response(request)
        finally:
            self._reset(tokens)
        response[HEADER] = request.request_id
        return response

    async def __acall__(self, request):
        tokens = self._bind(request)
        try:
            response = await self.get_response(request)
        finally:
            self._reset(tokens)
        response[HEADER] = request.request_id
        return response
