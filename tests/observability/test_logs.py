"""Log lines (config/logging.py, config/request_id.py, config/celery.py; docs/observability.md
"Logs"): a request's X-Request-ID kept when sane, made otherwise, returned, and on every JSON
line logged while it is served (sync and async views, Django's own lines too), with the trace
id of its `traceparent`; a Celery task it enqueued logs the same request id in a real worker;
the web server's own lines are JSON too; LOG_FORMAT's default follows DEBUG."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.http import HttpResponse
from django.test import AsyncClient, Client
from django.urls import include, path

from config import logging as log_config
from config.celery import _bind_log_context, _carry_log_context, _reset_log_context
from config.celery import app as celery_app
from config.management.commands.runstack import web_command
from config.tasks import health_beat
from pools import logcontext
from tests.conftest import require_service
from tests.process_output import read_output

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
HEX32 = re.compile(r"[0-9a-f]{32}")
log = logging.getLogger("tests.observability.views")


def sync_view(request):
    log.info("served %s", "sync")
    return HttpResponse("ok")


async def async_view(request):
    log.info("served %s", "async")
    return HttpResponse("ok")


def failing_view(request):
    raise RuntimeError("the view failed")


def enqueue_view(request):
    log.info("enqueueing")
    health_beat.delay()
    return HttpResponse("queued")


urlpatterns = [
    path("t/sync", sync_view),
    path("t/async", async_view),
    path("t/fail", failing_view),
    path("t/enqueue", enqueue_view),
    path("", include("config.urls")),  # the 404 page's navigation names the project's routes
]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture
def lines():
    """Every line logged meanwhile, through the JSON formatter settings.LOGGING uses, parsed."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(log_config.formatter("json"))
    root = logging.getLogger()
    root.addHandler(handler)

    def read():
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    read.text = stream.getvalue
    yield read
    root.removeHandler(handler)


def served(lines, how="sync"):
    return [line for line in lines() if line["event"] == f"served {how}"]


def test_the_settings_render_every_line_with_one_structlog_formatter():
    import structlog

    ours = [  # (pytest adds handlers of its own)
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler.formatter, structlog.stdlib.ProcessorFormatter)
    ]
    assert len(ours) == 1
    assert not logging.getLogger("django").handlers  # they would print Django's lines twice
    assert django_settings.MIDDLEWARE[0] == "config.request_id.RequestIdMiddleware"


def test_a_client_s_request_id_is_returned_and_on_its_lines_with_the_trace_id(lines):
    response = Client().get("/t/sync", HTTP_X_REQUEST_ID="req-7f3a", HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 200
    assert response["X-Request-ID"] == "req-7f3a"
    (line,) = served(lines)
    assert line["request_id"] == "req-7f3a" and line["trace_id"] == TRACE_ID
    assert line["level"] == "info" and line["logger"] == "tests.observability.views"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"])
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    # reset once served
    assert logcontext.request_id.get() == "" and logcontext.trace_id.get() == ""


def test_without_one_a_request_id_is_made(lines):
    first = Client().get("/t/sync")["X-Request-ID"]
    second = Client().get("/t/sync")["X-Request-ID"]
    assert HEX32.fullmatch(first) and HEX32.fullmatch(second) and first != second
    assert [line["request_id"] for line in served(lines)] == [first, second]
    assert all("trace_id" not in line for line in served(lines))


@pytest.mark.parametrize(
    "sent",
    [
        "x" * 129,
        "two words",
        'quote"and\\backslash',
        "<script>alert(1)</script>",
        "caf\u00e9",
        "line\nbreak",
        "nul\x00byte",
        "",
    ],
)
def test_an_insane_request_id_is_replaced_and_never_logged(lines, sent):
    response = Client().get("/t/sync", HTTP_X_REQUEST_ID=sent)
    made = response["X-Request-ID"]
    assert made != sent and HEX32.fullmatch(made)
    for line in lines():
        assert line["request_id"] == made
    if sent:
        assert sent not in lines.text() and json.dumps(sent)[1:-1] not in lines.text()


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-" + "0" * 16 + "-01",
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-more",
        "00-abc-def-01",
        "x" * 600,
    ],
)
def test_an_invalid_traceparent_binds_no_trace_id(lines, traceparent):
    Client().get("/t/sync", HTTP_X_REQUEST_ID="r1", HTTP_TRACEPARENT=traceparent)
    (line,) = served(lines)
    assert line["request_id"] == "r1" and "trace_id" not in line


def test_a_later_version_s_traceparent_gives_its_trace_id(lines):
    Client().get("/t/sync", HTTP_TRACEPARENT=f"01-{TRACE_ID}-00f067aa0ba902b7-01-what-comes")
    (line,) = served(lines)
    assert line["trace_id"] == TRACE_ID


def test_an_async_view_s_lines_carry_the_request_id(lines):
    """Through Django's ASGI handler, as the ASGI server serves it."""
    get = async_to_sync(AsyncClient().get)
    response = get("/t/async", headers={"X-Request-ID": "async-1", "traceparent": TRACEPARENT})
    assert response["X-Request-ID"] == "async-1"
    (line,) = served(lines, "async")
    assert line["request_id"] == "async-1" and line["trace_id"] == TRACE_ID
    assert logcontext.request_id.get() == ""


def test_django_s_own_lines_about_the_response_carry_it(lines):
    """ "Not Found" is logged after the middleware returned; "Internal Server Error" inside."""
    client = Client(raise_request_exception=False)
    assert client.get("/t/missing", HTTP_X_REQUEST_ID="nf-1").status_code == 404
    assert client.get("/t/fail", HTTP_X_REQUEST_ID="err-1").status_code == 500
    by_logger = [line for line in lines() if line["logger"] == "django.request"]
    (missing,) = [line for line in by_logger if line["event"].startswith("Not Found")]
    assert missing["request_id"] == "nf-1" and missing["status_code"] == 404
    (failed,) = [line for line in by_logger if line["event"].startswith("Internal Server Error")]
    assert failed["request_id"] == "err-1" and failed["level"] == "error"
    assert "RuntimeError: the view failed" in failed["exception"]


def test_a_task_enqueued_by_a_request_carries_its_ids_in_its_headers():
    headers: dict = {}
    tokens = logcontext.request_id.set("req-h"), logcontext.trace_id.set(TRACE_ID)
    try:
        _carry_log_context(headers=headers)
    finally:
        logcontext.trace_id.reset(tokens[1])
        logcontext.request_id.reset(tokens[0])
    assert headers == {"request_id": "req-h", "trace_id": TRACE_ID}
    empty: dict = {}
    _carry_log_context(headers=empty)  # outside a request: nothing
    assert empty == {}


def test_a_task_binds_the_ids_of_its_headers_while_it_runs(lines):
    class Request:
        request_id = "req-t"
        trace_id = TRACE_ID

    class Task:
        name = "some.task"
        request = Request()

    task = Task()
    _bind_log_context(task_id="tid-1", task=task)
    logging.getLogger("some.task").info("inside")
    _reset_log_context(task=task)
    logging.getLogger("some.task").info("after")
    inside, after = lines()
    assert inside["request_id"] == "req-t" and inside["trace_id"] == TRACE_ID
    assert inside["task_id"] == "tid-1" and inside["task_name"] == "some.task"
    assert not {"request_id", "trace_id", "task_id", "task_name"} & set(after)


def test_a_header_that_is_not_an_id_is_not_bound(lines):
    class Request:
        request_id = "bad id\n"
        trace_id = "nothex"

    class Task:
        name = "some.task"
        request = Request()

    _bind_log_context(task_id="tid-2", task=Task())
    logging.getLogger("some.task").info("inside")
    _reset_log_context(task=Task)
    (inside,) = lines()
    assert "request_id" not in inside and "trace_id" not in inside


# ---------------------------------------------------------------------- real processes
def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{user}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _wait_for(read, condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [line for line in _json_lines(read()) if condition(line)]
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what} not logged within {timeout} s:\n{read()[-3000:]}")


@pytest.fixture
def celery_worker_log(tmp_path):
    """A real Celery worker (`celery -A config worker`, LOG_FORMAT=json) on a queue of its own;
    this process's tasks are sent to it, not run inline."""
    try:
        redis.Redis.from_url(django_settings.REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        require_service(False, f"Redis at {django_settings.REDIS_URL}")
    queue = f"test-logs-{uuid.uuid4().hex[:8]}"
    name = f"{queue}@test"
    log_file = tmp_path / "worker.log"
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.scheduling.worker_settings",
        "DATABASE_URL": _database_url(),
        "TEST_CELERY_QUEUE": queue,
        # this process's Redis prefix: the one its tasks are sent under
        "DEPLOYMENT_PREFIX": django_settings.DEPLOYMENT_PREFIX,
        "LOG_FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue, "-n", name]
    command += ["--concurrency", "1", "--pool", "prefork", "--loglevel", "info"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with open(log_file, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
    conf = celery_app.conf
    saved = conf.task_always_eager, conf.task_default_queue
    try:
        deadline = time.monotonic() + 60
        while not celery_app.control.ping(destination=[name], timeout=0.5):
            assert process.poll() is None, log_file.read_text()[-3000:]
            assert time.monotonic() < deadline, log_file.read_text()[-3000:]
        conf.task_always_eager, conf.task_default_queue = False, queue
        yield log_file.read_text
    finally:
        conf.task_always_eager, conf.task_default_queue = saved
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.slow
def test_a_task_enqueued_by_a_request_logs_its_request_id_in_a_real_worker(
    lines, celery_worker_log
):
    request_id = f"celery-{uuid.uuid4().hex[:8]}"
    response = Client().get(
        "/t/enqueue", HTTP_X_REQUEST_ID=request_id, HTTP_TRACEPARENT=TRACEPARENT
    )
    assert response.status_code == 200
    (enqueued,) = [line for line in lines() if line["event"] == "enqueueing"]
    assert enqueued["request_id"] == request_id
    (done, *_) = _wait_for(
        celery_worker_log,
        lambda line: line.get("task_name") == "config.health_beat" and "succeeded" in line["event"],
        30,
        "the task's success",
    )
    assert done["request_id"] == request_id and done["trace_id"] == TRACE_ID
    assert HEX32.fullmatch(done["task_id"].replace("-", ""))
    # the worker's own lines (ready, received …) are JSON lines of the same formatter
    worker_lines = _json_lines(celery_worker_log())
    assert any(line["logger"].startswith("celery") for line in worker_lines)
    assert all({"timestamp", "level", "logger", "event"} <= set(line) for line in worker_lines)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_asgi_server_s_lines_are_json_with_the_request_id():
    """hypercorn, as `make run` starts it, with LOG_FORMAT=json: every line it writes is a JSON
    object, its access line of a request carries the request id."""
    port = _free_port()
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": _database_url(),
        "LOG_FORMAT": "json",
        "DEBUG": "false",
        "PYTHONUNBUFFERED": "1",
    }
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(web_command("127.0.0.1", port), env=env, stdout=out, stderr=out)

        def read() -> str:
            return read_output(out)

        try:
            url = f"http://127.0.0.1:{port}/api/v1/no-such-thing"
            deadline = time.monotonic() + 60
            while True:
                request = urllib.request.Request(url, headers={"X-Request-ID": "web-1"})
                try:
                    urllib.request.urlopen(request, timeout=5)
                except urllib.error.HTTPError as exc:
                    assert exc.headers["X-Request-ID"] == "web-1"
                    break
                except OSError:
                    assert process.poll() is None and time.monotonic() < deadline, read()
                    time.sleep(0.3)
            (access, *_) = _wait_for(
                read,
                lambda line: (
                    line["logger"] == "hypercorn.access" and "no-such-thing" in line["event"]
                ),
                15,
                "the access line",
            )
            assert access["request_id"] == "web-1"
            not_found = _wait_for(
                read,
                lambda line: (
                    line["logger"] == "django.request" and "no-such-thing" in line["event"]
                ),
                15,
                "Django's line about the 404",
            )
            assert all(line["request_id"] == "web-1" for line in not_found)
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        text = read()
    written = [line for line in text.splitlines() if line.strip()]
    assert written and all(line.startswith("{") for line in written), text[-3000:]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"DEBUG": "true"}, "console"),
        ({"DEBUG": "false"}, "json"),
        ({"DEBUG": "true", "LOG_FORMAT": "json"}, "json"),
        ({"DEBUG": "false", "LOG_FORMAT": "console"}, "console"),
    ],
)
def test_log_format_defaults_to_console_with_debug_and_json_otherwise(env, expected):
    environment = {k: v for k, v in os.environ.items() if k not in ("LOG_FORMAT", "DEBUG")}
    environment |= env | {"DJANGO_SETTINGS_MODULE": "config.settings"}
    code = "from django.conf import settings; print(settings.LOG_FORMAT)"
    answer = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert answer.stdout.strip() == expected, answer.stderr


def test_an_unknown_log_format_stops_the_start():
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        log_config.logging_config("xml")
