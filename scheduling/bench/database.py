"""The throwaway PostgreSQL database of the benchmarks that build a fleet (bench_scheduler,
bench_sweeps): made and migrated as Django's test runner makes one, dropped at the end."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/computepool"


def rerun_on_postgresql() -> None:
    """Over SQLite this process runs itself again over DATABASE_URL when that is PostgreSQL's,
    else DEFAULT_URL, and exits with its status; over PostgreSQL it returns."""
    if connection.vendor == "postgresql":
        return
    url = os.environ.get("DATABASE_URL") or ""
    env = {**os.environ, "DATABASE_URL": url if "postgres" in url else DEFAULT_URL}
    sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))


@contextmanager
def throwaway_database(prefix: str):
    """The default connection on a new database `<prefix>_<random>` while the block runs."""
    database = settings.DATABASES["default"]
    original = database["NAME"]
    database.setdefault("TEST", {})["NAME"] = f"{prefix}_{secrets.token_hex(4)}"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield
    finally:
        connection.creation.destroy_test_db(original, verbosity=0)
