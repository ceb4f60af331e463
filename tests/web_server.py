"""The real web server process, started as `make run` starts it (runstack's `web_command`:
hypercorn with config/hypercorn.py), against the test database and the real Redis."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest
from django.db import connection

from config.management.commands.runstack import web_command
from tests.process_output import read_output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _test_database_url() -> str:
    db = connection.settings_dict  # the test database, once pytest-django has set it up
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{user}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@contextmanager
def web_server(**env: str):
    """Yields the server's base URL; `env` adds settings (HTTP_HEADER_TIMEOUT_S=…)."""
    port = _free_port()
    environment = os.environ | {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": _test_database_url(),
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    url = f"http://127.0.0.1:{port}"
    # a file, never a pipe: a full pipe would stall the server
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            web_command("127.0.0.1", port), env=environment, stdout=log, stderr=log
        )
        try:
            _wait_until_it_answers(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_it_answers(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/accounts/login/", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the web server did not start: {read_output(log)[-2000:]!r}")
            time.sleep(0.3)
