import pytest

from config import tasks


@pytest.fixture
def heartbeat():
    """Beat and a worker have just run the heartbeat task (for real, against Redis)."""
    tasks.health_beat()
    yield
    tasks.redis_client().delete(tasks.heartbeat_key())


def test_health_reports_database_redis_and_celery(client, db, heartbeat):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"]["ok"] and body["database"]["detail"] == "postgresql"
    assert body["redis"]["ok"]
    assert body["celery"]["ok"]


def test_health_says_which_part_is_down(client, db, heartbeat, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"
    assert response.json()["redis"]["ok"] is False
    assert response.json()["database"]["ok"] is True
