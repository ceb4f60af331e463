"""Project-level endpoints: health."""

import time

from django.db import connection
from django.http import JsonResponse

from . import tasks


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
        beat = tasks.redis_client().get(tasks.HEARTBEAT_KEY)
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
