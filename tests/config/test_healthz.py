def test_health_reports_database_and_redis(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["database"]["ok"] and body["database"]["detail"] == "postgresql"
    assert body["redis"]["ok"]


def test_health_says_which_part_is_down(client, db, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"
    assert response.json()["redis"]["ok"] is False
    assert response.json()["database"]["ok"] is True
