"""Every log line of the web server, Celery and the management commands through one formatter
(docs/observability.md, "Logs"): structlog's ProcessorFormatter on the standard library's
handlers, so Django's, Celery's, hypercorn's and our own `logging.getLogger(__name__)` lines (and
any `structlog.get_logger()` ones) come out alike:

- `json`: one JSON object per line, `timestamp` (ISO 8601, UTC), `level`, `logger`, `event`
  (the message), `request_id` and `trace_id` when the line was logged while serving a request
  or a task that has them (pools.logcontext), a Celery task's `task_id` and `task_name`,
  `exception` (the formatted traceback) when there is one;
- `console`: the same fields for people, one line each (structlog's ConsoleRenderer).

settings.LOGGING names `formatter` as its formatter's factory; LOG_FORMAT picks the renderer.
"""

from __future__ import annotations

import logging
import logging.config
import sys

import structlog

from pools import logcontext

FORMATS = ("json", "console")


def add_log_context(_logger, _method, event_dict: dict) -> dict:
    """The request id and the trace id of the context the line was logged in. A line Django
    logs about a response after the middleware chain has returned ("Not Found: …") carries its
    request as `extra`: its id then comes from there (config/request_id.py puts it on the
    request)."""
    request_id = logcontext.request_id.get()
    if not request_id:
        record = event_dict.get("_record")
        request_id = getattr(record, "request_id", "") or getattr(
            getattr(record, "request", None), "request_id", ""
        )
    if request_id and isinstance(request_id, str):
        event_dict.setdefault("request_id", request_id)
    trace_id = logcontext.trace_id.get()
    if trace_id:
        event_dict.setdefault("trace_id", trace_id)
    return event_dict


class AccessLineRequestId(logging.Filter):
    """The ASGI server's access line is logged after the request was served, outside its
    context: its request id is the response's X-Request-ID header, one of the line's atoms."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):
            record.request_id = record.args.get("{x-request-id}o", "")
        return True


def shared_processors() -> list:
    """What every line goes through before it is rendered, whoever logged it."""
    return [
        structlog.contextvars.merge_contextvars,  # a Celery task's id and name (config/celery.py)
        add_log_context,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(allow=("status_code",)),  # django.request's responses
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]


FIRST_KEYS = ("timestamp", "level", "logger", "event")


def leading_keys(_logger, _method, event_dict: dict) -> dict:
    """timestamp, level, logger and event first in a JSON line, for people reading them raw."""
    first = {key: event_dict.pop(key) for key in FIRST_KEYS if key in event_dict}
    return first | event_dict


def renderer(format_name: str):
    if format_name == "json":
        return structlog.processors.JSONRenderer()
    if format_name == "console":
        return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    raise ValueError(f"LOG_FORMAT must be one of {', '.join(FORMATS)}, not {format_name!r}")


def formatter(format_name: str = "json") -> structlog.stdlib.ProcessorFormatter:
    """The formatter of settings.LOGGING's handlers (its `()` factory). Also makes structlog's
    own loggers hand their lines to the standard library, so they meet the same handlers."""
    configure_structlog()
    final = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if format_name == "json":
        # the traceback as one string field; the console renderer prints it itself
        final += [structlog.processors.format_exc_info, leading_keys]
    final.append(renderer(format_name))
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared_processors(), processors=final
    )


def configure_structlog() -> None:
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def logging_config(format_name: str, level: str = "INFO") -> dict:
    """settings.LOGGING: one handler on the root logger, rendered by `formatter`; Django's own
    loggers keep no handler of their own (they would print their lines a second time, in
    Django's format) and propagate to it."""
    renderer(format_name)  # a wrong LOG_FORMAT fails at start, not at the first line
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {"()": "config.logging.formatter", "format_name": format_name}
        },
        "filters": {"access_request_id": {"()": "config.logging.AccessLineRequestId"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django": {"handlers": [], "level": level, "propagate": True},
            "django.server": {"handlers": [], "level": level, "propagate": True},
            "django.db.backends": {"level": "WARNING"},
            "hypercorn.access": {"filters": ["access_request_id"]},
        },
    }


def configure_from_settings(level: str | int | None = None) -> None:
    """settings.LOGGING applied again (a Celery worker, once it took over logging's set-up),
    the root logger at `level` when one is given."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if level:
        logging.getLogger().setLevel(level)
