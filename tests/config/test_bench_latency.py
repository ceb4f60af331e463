"""`manage.py bench_latency` end to end, small: its own stack (server, Celery worker with beat,
a Docker agent) on a throwaway database, five jobs at one a second, one JSON object, and
nothing of it left afterwards."""

import json
import os
import subprocess
import sys

import psycopg
import pytest
import redis
from django.conf import settings

from config.management.commands.bench_latency import CLAIM_KEY
from config.management.commands.runstack import docker_answers, registry_answers
from tests.conftest import require_service

SPANS = ("submitted_to_leased", "leased_to_running", "submitted_to_running", "leased_to_ended")


@pytest.mark.slow
@pytest.mark.docker
def test_bench_latency_runs_five_jobs_and_reports_their_spans_and_the_engine_floor():
    require_service(docker_answers(), "the Docker engine")
    require_service(registry_answers() == (True, True), "the loopback registry's test image")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    command = [sys.executable, "manage.py", "bench_latency", "--json"]
    out = subprocess.run(
        [*command, "--rate", "60", "--jobs", "5", "--timeout", "30", "--floor-runs", "2"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard: under the loaded suite its stack starts slowly
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = out.stdout.strip().splitlines()  # one JSON object, nothing else
    result = json.loads(line)

    assert result["rate_per_min"] == 60 and result["jobs"] == 5 and result["all_ended"]
    assert result["submit"]["accepted"] == 5 and result["submit"]["refused"] == 0
    assert result["states"] == {"succeeded": 5}
    for name in SPANS:
        span = result[name]
        assert span["n"] == 5, (name, span)
        assert 0 <= span["p50"] <= span["p90"] <= span["p99"] <= span["max"], (name, span)
    steps = result["leased_to_running_steps_p50"]
    assert set(steps) == {"leased_to_pulling", "pulling_to_starting", "starting_to_running"}
    assert all(value is not None and value >= 0 for value in steps.values()), steps
    floor = result["engine_floor"]
    assert floor["runs"] == 2 and floor["docker_run_s"]["median"] > 0
    assert set(floor["sdk_median"]) == {"create_s", "start_s", "wait_s", "remove_s", "total_s"}
    assert result["leased_to_running_p50_over_floor"] == pytest.approx(
        result["leased_to_running"]["p50"] / floor["docker_run_s"]["median"], abs=0.01
    )

    # what it made is gone: its database dropped, its Redis database flushed
    stack = result["stack"]
    assert stack["database"].startswith("bench_latency_")
    database = settings.DATABASES["default"]
    server = {key.lower(): database[key] for key in ("HOST", "PORT", "USER", "PASSWORD")}
    with psycopg.connect(dbname="postgres", **{k: v for k, v in server.items() if v}) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [stack["database"]])
        assert left.fetchone() is None
    with redis.Redis.from_url(stack["redis"]) as claimed:
        assert claimed.get(CLAIM_KEY) is None
