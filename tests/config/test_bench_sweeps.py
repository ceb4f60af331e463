"""The periodic tasks' benchmark (config/management/commands/bench_sweeps.py): every task of
beat's schedule runs over a fleet at work, none fails, each gets its share of a worker, and the
throwaway database is dropped."""

import json
import os
import subprocess
import sys

import psycopg
from django.conf import settings

from config.celery import app


def bench_databases() -> set[str]:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres"
    ) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'bench_sweeps_%'")
        return {row[0] for row in rows}


def test_every_periodic_task_is_measured_over_a_fleet_at_work():
    before = bench_databases()
    command = [sys.executable, "manage.py", "bench_sweeps", "--nodes", "20", "--jobs", "15"]
    done = subprocess.run(
        [*command, "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["failed"] == {}
    assert 0 < figures["jobs_running"] <= 15
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert set(figures["tasks"]) == scheduled
    for name, task in figures["tasks"].items():
        assert task["wall_s"] > 0 and task["period_s"] > 0, name
        share = task["wall_s"] / task["period_s"]  # both rounded to 4 places
        assert abs(task["share_of_a_worker"] - share) <= 1e-4, name
    assert figures["share_of_a_worker"] > 0
    assert bench_databases() == before
