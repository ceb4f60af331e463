"""Issue 9, low: /healthz says when Celery beat or its worker has gone silent (real Redis)."""

import re
import time

import pytest
import redis
from django.conf import settings

from config import tasks
from config.celery import app


@pytest.fixture
def heartbeat_key():
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.delete(tasks.heartbeat_key())


def test_the_heartbeat_is_on_the_beat_schedule():
    entries = [e for e in app.conf.beat_schedule.values() if e["task"] == "config.health_beat"]
    assert entries and entries[0]["schedule"] == tasks.HEARTBEAT_PERIOD_S


def test_health_is_ok_while_beat_and_worker_record_heartbeats(client, db, heartbeat_key):
    tasks.health_beat.delay()  # eager in tests: the task itself, run for real against Redis
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["celery"]["ok"] is True


def test_health_is_503_when_the_heartbeat_is_stale(client, db, heartbeat_key):
    heartbeat_key.set(tasks.heartbeat_key(), time.time() - 120)
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["celery"]["ok"] is False
    assert re.fullmatch(r"beat or worker silent for 12\d s", body["celery"]["detail"])
    assert body["database"]["ok"] and body["redis"]["ok"]


def test_health_is_503_when_no_heartbeat_was_ever_recorded(client, db, heartbeat_key):
    heartbeat_key.delete(tasks.heartbeat_key())
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["celery"]["ok"] is False
    assert "no heartbeat" in response.json()["celery"]["detail"]
