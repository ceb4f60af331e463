"""Project-level endpoints: health."""

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True, connection.vendor
    except Exception as exc:  # reported, not raised: this endpoint exists to say what is down
        return False, str(exc)[:200]


def _redis_ok() -> tuple[bool, str]:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
        )
        client.ping()
        return True, "ping"
    except Exception as exc:
        return False, str(exc)[:200]


def healthz(request):
    """Unauthenticated on purpose (load balancers probe it); it reveals no tenant data."""
    db_ok, db_detail = _database_ok()
    redis_ok, redis_detail = _redis_ok()
    healthy = db_ok and redis_ok
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {"ok": db_ok, "detail": db_detail},
        "redis": {"ok": redis_ok, "detail": redis_detail},
    }
    return JsonResponse(body, status=200 if healthy else 503)
