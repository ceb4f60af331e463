"""Project-level endpoints: health, the favicon, and the error pages (the console's styled
403 and 404; the API's one JSON error body under /api/)."""

import time
from functools import cache

from django.contrib.staticfiles import finders
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.views import defaults

from . import tasks
from .middleware import api_error, is_api


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, connection.vendor
    except Exception as exc:  # reported, not raised: this endpoint exists to say what is down
        return False, str(exc)[:200]


def _redis_ok() -> tuple[bool, str]:
    try:
        tasks.redis_client().ping()
        return True, "ping"
    except Exception as exc:
        return False, str(exc)[:200]


def _celery_ok() -> tuple[bool, str]:
    """Beat schedules `config.health_beat` and a worker runs it: a stale mark means either is
    down, and queued jobs wait for nobody."""
    try:
        beat = tasks.redis_client().get(tasks.heartbeat_key())
    except Exception as exc:
        return False, str(exc)[:200]
    if beat is None:
        return False, "no heartbeat from beat and worker yet"
    silent_s = time.time() - float(beat)
    if silent_s > tasks.HEARTBEAT_STALE_S:
        return False, f"beat or worker silent for {silent_s:.0f} s"
    return True, f"heartbeat {silent_s:.0f} s ago"


def healthz(request):
    """Unauthenticated on purpose (load balancers probe it); it reveals no tenant data."""
    db_ok, db_detail = _database_ok()
    redis_ok, redis_detail = _redis_ok()
    celery_ok, celery_detail = _celery_ok()
    healthy = db_ok and redis_ok and celery_ok
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {"ok": db_ok, "detail": db_detail},
        "redis": {"ok": redis_ok, "detail": redis_detail},
        "celery": {"ok": celery_ok, "detail": celery_detail},
    }
    return JsonResponse(body, status=200 if healthy else 503)


# --- the favicon and the error pages ------------------------------------------------------------

FAVICON = "favicon.svg"


@cache
def _favicon() -> bytes:
    path = finders.find(FAVICON)
    if path is None:  # the file ships in static/: missing, it is a 404 like any other
        raise Http404("No favicon.")
    with open(path, "rb") as icon:
        return icon.read()


def favicon(request):
    """/favicon.ico, which browsers ask for on their own: the console's SVG icon (base.html
    links it from static/ too), cached for a day, instead of a 404 on every first visit."""
    response = HttpResponse(_favicon(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


def _api_error(request, status: int, code: str, detail: str):
    return api_error(status, code, detail) if is_api(request) else None


def page_not_found(request, exception):
    """The console's 404 page (templates/404.html: the site's header and navigation); under
    /api/ the API's JSON error body."""
    answer = _api_error(request, 404, "not_found", "No API route matches this path.")
    return answer or defaults.page_not_found(request, exception)


def permission_denied(request, exception):
    """The console's 403 page (templates/403.html); under /api/ the API's JSON error body."""
    answer = _api_error(request, 403, "permission_denied", "You may not do this.")
    return answer or defaults.permission_denied(request, exception)
