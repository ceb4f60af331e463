"""The health heartbeat: beat schedules it and a worker runs it, so a fresh timestamp in Redis
proves both are alive (config.views.healthz reads it)."""

import time

import redis
from celery import shared_task
from django.conf import settings

HEARTBEAT_PERIOD_S = 5.0  # its entry in config/celery.py's beat schedule
# Missing three beats in a row means beat or every worker is gone (or hopelessly behind).
HEARTBEAT_STALE_S = 3 * HEARTBEAT_PERIOD_S


def heartbeat_key() -> str:
    return f"computepool:health:beat:{settings.DEPLOYMENT_PREFIX}"  # this deployment's


def redis_client():
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


@shared_task(name="config.health_beat", ignore_result=True)
def health_beat() -> None:
    # The timestamp says how fresh it is; the expiry only keeps Redis tidy once all stopped.
    redis_client().set(heartbeat_key(), time.time(), ex=3600)
