"""The agent's log lines (worker_agent/logs.py, docs/observability.md "Logs"): JSON lines, those
of a job's runner carrying the job and the trace id of its assignment's `traceparent`; one
X-Request-ID per call to the control plane, retries included, on the call's lines too."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker_agent import cli, logs
from worker_agent.client import ApiClient
from worker_agent.runner import Runner
from worker_agent.runtime.base import Assignment
from worker_agent.state import AgentState

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Server:
    """Answers every request with the next of `statuses` (then 200 {}), recording headers."""

    def __init__(self, statuses=()):
        self.statuses = list(statuses)
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.headers.append(dict(self.headers))
                status = server.statuses.pop(0) if server.statuses else 200
                data = b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def lines():
    """The agent's logging as its CLI sets it up, in JSON, into a buffer; the lines parsed."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    assert logs.configure("INFO", "json", stream=stream) == "json"

    def read():
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    yield read
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


@pytest.fixture
def server():
    running = Server()
    yield running
    running.close()


def client_for(server: Server, tmp_path) -> ApiClient:
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": "cpn_test"})
    return ApiClient(server.url, state, backoff=0.01, retries=2)


def run_runner(data: dict, server: Server, tmp_path) -> Runner:
    """A runner whose runtime this node does not offer: it logs, reports the job failed
    (runtime_unavailable) and ends, nothing pulled or started."""
    runner = Runner(
        Assignment.parse(data),
        client=client_for(server, tmp_path),
        runtime=None,
        workdir=tmp_path / f"work-{data['job']}",
    )
    runner.start()
    runner.join(20)
    assert not runner.is_alive()
    return runner


def assignment(job: int, **changes) -> dict:
    return {
        "job": job,
        "attempt": 2,
        "lease": job * 10,
        "fencing_token": "7",
        "state": "leased",
        "image": "",
        "command": ["true"],
        "runtime": "gvisor",
    } | changes


def test_a_job_s_lines_are_json_carrying_its_trace_id(lines, server, tmp_path):
    run_runner(assignment(501, traceparent=TRACEPARENT), server, tmp_path)
    mine = [line for line in lines() if line.get("job") == 501]
    assert mine, lines()
    for line in mine:
        assert line["trace_id"] == TRACE_ID
        assert line["attempt"] == 2
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"])
        assert line["level"] in ("info", "warning", "error")
        assert line["logger"].startswith("worker_agent")
    assert any("runtime_unavailable" in line["event"] for line in mine)
    # the report of the job went out with a request id of its own
    assert re.fullmatch(r"[0-9a-f]{32}", server.headers[-1]["X-Request-ID"])


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "",
        42,
        ["00"],
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra",
        "x" * 600,
    ],
)
def test_an_unreadable_traceparent_gives_no_trace_id_and_no_error(
    lines, server, tmp_path, traceparent
):
    data = assignment(502)
    if traceparent is not None:
        data["traceparent"] = traceparent
    runner = run_runner(data, server, tmp_path)
    assert runner.outcome is not None and runner.outcome.reason == "runtime_unavailable"
    mine = [line for line in lines() if line.get("job") == 502]
    assert mine and all("trace_id" not in line for line in mine)


def test_lines_outside_a_job_carry_no_job(lines):
    logging.getLogger("worker_agent.agent").info("agent %s", "started")
    (line,) = lines()
    assert line["event"] == "agent started"
    assert "job" not in line and "trace_id" not in line and "request_id" not in line


def test_a_call_and_its_retries_share_one_request_id_which_its_lines_carry(lines, tmp_path):
    server = Server(statuses=[503, 503])
    try:
        client_for(server, tmp_path).me()
    finally:
        server.close()
    ids = [headers["X-Request-ID"] for headers in server.headers]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", ids[0])
    retries = [line for line in lines() if "retry" in line["event"]]
    assert len(retries) == 2
    assert all(line["request_id"] == ids[0] for line in retries)
    assert logs.request_id.get() == ""  # unbound once the call returned


def test_two_calls_have_two_request_ids(server, tmp_path):
    client = client_for(server, tmp_path)
    client.me()
    client.me()
    first, second = (headers["X-Request-ID"] for headers in server.headers)
    assert first != second


def test_an_exception_is_one_json_line_with_its_traceback(lines):
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("worker_agent.runner").exception("job %s: runner error", 7)
    (line,) = lines()
    assert line["level"] == "error" and line["event"] == "job 7: runner error"
    assert "RuntimeError: boom" in line["exception"]


def test_console_format_is_for_people(tmp_path):
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = io.StringIO()
    try:
        logs.configure("INFO", "console", stream=stream)
        logging.getLogger("worker_agent.agent").info("node %s resumes", "n1")
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
    text = stream.getvalue()
    assert "node n1 resumes" in text and not text.lstrip().startswith("{")


def test_auto_is_console_on_a_terminal_and_json_otherwise():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert logs.resolve_format("auto", Terminal()) == "console"
    assert logs.resolve_format("auto", io.StringIO()) == "json"
    assert logs.resolve_format("JSON", Terminal()) == "json"
    with pytest.raises(ValueError):
        logs.resolve_format("xml")


def test_the_cli_takes_a_log_format_from_its_flag_or_its_variable(monkeypatch):
    assert cli.parser().parse_args(["--log-format", "json"]).log_format == "json"
    monkeypatch.setenv("WORKER_AGENT_LOG_FORMAT", "console")
    assert cli.parser().parse_args([]).log_format == "console"
    monkeypatch.delenv("WORKER_AGENT_LOG_FORMAT")
    assert cli.parser().parse_args([]).log_format == "auto"
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--log-format", "xml"])
