"""The WSGI entry point serves the API, with the start-up heap frozen (short GC pauses)."""

import json
import os
import subprocess
import sys

from django.conf import settings

from config import tasks

PROBE = """
import gc, io, json
from config.wsgi import application
from config.tasks import health_beat
frozen = gc.get_freeze_count()
health_beat()  # as beat and a worker would have: /healthz also reports Celery
environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz", "SERVER_NAME": "127.0.0.1",
           "SERVER_PORT": "80", "HTTP_HOST": "127.0.0.1", "wsgi.input": io.BytesIO(),
           "wsgi.url_scheme": "http", "QUERY_STRING": ""}
statuses = []
body = b"".join(application(environ, lambda status, headers: statuses.append(status)))
print(json.dumps({"frozen": frozen, "status": statuses[0], "body": json.loads(body)}))
"""


def test_wsgi_application_answers_and_freezes_the_startup_heap(db):
    database = settings.DATABASES["default"]["NAME"]  # the test database
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{database}",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    tasks.redis_client().delete(tasks.heartbeat_key())
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"].startswith("200")
    assert result["body"]["database"]["ok"] is True
    # a Django process holds well over 50,000 objects after start-up; none is walked by a
    # full collection any more
    assert result["frozen"] > 50_000
