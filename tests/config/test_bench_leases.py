"""`manage.py bench_leases` end to end, briefly: a real gunicorn server over the test database."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from leases.models import Lease


@pytest.mark.django_db(transaction=True)
def test_bench_leases_grants_over_http_and_leaves_the_ledger_clean():
    database = settings.DATABASES["default"]["NAME"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{database}",
    }
    command = [sys.executable, "manage.py", "bench_leases", "--json", "--client", "python"]
    command += ["--clients", "4", "--seconds", "1", "--warmup", "0", "--workers", "1"]
    out = subprocess.run(
        [*command, "--threads", "4", "--nodes", "2"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["grants"] > 0 and result["grants_per_s"] > 0
    assert result["errors"] == 0, result["error_samples"]
    assert result["overcommitted_nodes"] == 0 and result["ledger_problems"] == 0
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["keep_alive"] is False  # 4 connections, 4 threads: gthread closes them
    assert not Lease.objects.exists()  # what it seeded is removed
