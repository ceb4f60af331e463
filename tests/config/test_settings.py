"""The settings work on SQLite (make run) and PostgreSQL (tests, production)."""

import os
import subprocess
import sys
from pathlib import Path

from django.core.management import call_command
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_suite_runs_on_postgresql(db):
    assert connection.vendor == "postgresql"


def test_sqlite_default_migrates_and_serves_health(tmp_path):
    env = os.environ | {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    script = (
        "import django; django.setup();"
        "from django.core.management import call_command;"
        "call_command('migrate', verbosity=0);"
        "from django.db import connection; print(connection.vendor)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip().endswith("sqlite")
    assert (tmp_path / "db.sqlite3").stat().st_size > 0


def test_migrations_are_complete(db):
    # Raises SystemExit(1) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
