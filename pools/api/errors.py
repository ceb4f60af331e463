"""One error shape for every 4xx of the API (docs/api.md):

    {"code": "invalid", "message": "…", "detail": "…", "errors": {"field": ["…"]}, …}

`code` is the reason code a script branches on; `message` says it in words (`detail` is the
same text, kept for clients written against the first API); `errors` holds the field errors
(`{}` when there are none; each field's errors also stay at the top level, as before); a refusal
adds its own facts beside them (reasons, nearest miss, …)."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError, InterfaceError, OperationalError, connection
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from pools.statemachine import Refusal


def error(status_code, code, detail):
    set_rollback()
    return Response(error_body(code, detail), status=status_code)


def error_body(code: str, detail: str, **facts) -> dict:
    """The one error body, for answers made outside DRF's handler (middleware) too."""
    return one_shape({"code": code, "detail": detail, **facts})


def one_shape(body: dict, errors: dict | None = None) -> dict:
    """`body` ({"code", "detail", …}) with `message` and `errors` (field errors; {} if none)."""
    message = body.get("message") if isinstance(body.get("message"), str) else None
    message = message or str(body.get("detail") or "")
    detail = body.get("detail", message)
    return {**body, "message": message, "detail": detail, "errors": errors or {}}


# SQLSTATE classes a retry may get past: connection lost or refused (08), too many connections
# (53), the server shutting down or starting (57), a serialization failure or deadlock (40).
TRANSIENT_SQLSTATE_CLASSES = ("08", "53", "57", "40")


def database_unavailable(exc: OperationalError | InterfaceError) -> bool:
    """Whether the database was away (retry) rather than the statement wrong (no retry helps)."""
    if isinstance(exc, InterfaceError):  # the connection was already closed
        return True
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate:
        return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES
    if connection.vendor == "sqlite":  # SQLite names no state: only a lock is worth waiting out
        return "locked" in str(exc)
    return True  # psycopg names none when the connection itself failed


def exception_handler(exc, context):
    if isinstance(exc, Refusal):  # transitions refused, no capacity, never fits, key reused …
        set_rollback()
        return Response(one_shape(exc.body()), status=exc.status)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    # The database did not answer (restarting, failing over, out of connections): clients (the
    # agent's among them, worker_agent/client.py) retry a 503. As a 500 they did not: during the
    # drill's PostgreSQL restart (issue 25) an agent's end-of-job report was dropped. A connection
    # lost during COMMIT leaves a write's outcome unknown: the answer says to resend it with its
    # Idempotency-Key. Other database errors (a missing table, say) stay 500s: no retry helps.
    if isinstance(exc, OperationalError | InterfaceError) and database_unavailable(exc):
        response = error(
            503,
            "unavailable",
            "The database did not answer; try again shortly (a write's outcome is unknown: "
            "send it again with the same Idempotency-Key).",
        )
        response["Retry-After"] = "1"
        return response
    if isinstance(exc, IntegrityError):
        return error(409, "conflict", "The request conflicts with existing data.")
    # The last line of defence: a value the serializers let through that PostgreSQL refuses
    # (an integer out of range, say) is the client's error, not the server's.
    if isinstance(exc, DataError):
        return error(400, "invalid", "A value is out of range or of the wrong kind.")
    # Django's body limits (DATA_UPLOAD_MAX_*), raised when the view first reads request.data;
    # left alone they become Django's HTML 400 page.
    if isinstance(exc, RequestDataTooBig):
        return error(413, "request_too_large", "The request body is too large.")
    if isinstance(exc, SuspiciousOperation):
        return error(400, "bad_request", str(exc) or "The request was refused.")
    if isinstance(exc, Http404):  # as DRF's handler does, so that exc has its codes below
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = drf_exception_handler(exc, context)
    if response is not None:
        fields = response.data if isinstance(exc, exceptions.ValidationError) else None
        errors = dict(fields) if isinstance(fields, dict) else None
        response.data = one_shape(_with_code(response.data, exc), errors)
    return response


def _with_code(data, exc):
    """DRF's bodies ({"detail": ...}, field errors, or a bare list) with code and detail added."""
    codes = exc.get_codes()
    if isinstance(data, list):  # ValidationError("...") raised without a field
        code = codes[0] if codes and isinstance(codes[0], str) else exc.default_code
        return {"code": code, "detail": " ".join(str(message) for message in data)}
    if set(data) == {"detail"}:
        return {"code": codes if isinstance(codes, str) else exc.default_code, **data}
    return {"code": exc.default_code, "detail": str(exc.default_detail), **data}
