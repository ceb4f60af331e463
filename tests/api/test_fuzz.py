"""The bounded form of `make fuzz` (#13): schemathesis against a live server on loopback, every
operation of the schema with a few roles' real credentials and a few cases each; 0 server
errors, every response as the schema says (config/management/commands/fuzz_api.py)."""

import json
import os
import subprocess
import sys

from django.conf import settings

from tests.conftest import require_service


def redis_and_registry_up() -> bool:
    import socket

    for port in (6379, 5000):  # Redis; the loopback registry the seeded jobs' image is in
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return False
    return True


def test_fuzzing_finds_no_server_error_and_no_schema_mismatch():
    require_service(redis_and_registry_up(), "Redis and the loopback registry")
    command = [sys.executable, "manage.py", "fuzz_api", "--json", "--examples", "2"]
    command += ["--phases", "examples,fuzzing", "--roles", "member,operator,node,anonymous"]
    done = subprocess.run(
        command,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == 0
    assert result["operations"] >= 60  # every operation of the schema was selected
    assert all(role["cases"] >= role["operations"] for role in result["roles"].values())
