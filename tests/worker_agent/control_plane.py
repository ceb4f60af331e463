"""A small real HTTP server speaking the agent API's shape (docs/data-plane.md): it serves the
assignments a test sets and records every report, log chunk and output upload the agent
sends. It stands in for the control plane in the agent's own tests; the end-to-end tests
run the agent against the real one."""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import uuid
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


class ControlPlane:
    def __init__(self):
        self.assignments: list[dict] = []
        self.requests: list[tuple[str, str, object]] = []
        self.headers: list[tuple[str, dict]] = []  # (path, headers) of each request, in order
        self.refuse_steps: set[str] = set()  # steps answered 409 fencing_token_mismatch
        self.unavailable_steps: dict[str, int] = {}  # step → how many of its reports get 503
        self.credential = "cpn_test"
        # who this control plane is, and the node it enrolls: each test's agent owns its own
        # containers on the engine every test process shares
        self.control_plane = str(uuid.uuid4())
        self.node_id = random.SystemRandom().randrange(1, 2**31)
        self.statuses: list[int] = []  # statuses to answer first, one per request (503 …)
        self.answers: dict[str, dict] = {}  # body answered per path (default {"ok": true})
        self.input_headers: list[dict] = []  # headers of requests for input files
        self.on_refused = None  # called when a request's credential is refused (401)
        self.on_report = None  # called with each report's body before it is answered
        # job → the checkpoint.tar served to its next attempt (default: its newest upload)
        self.checkpoints: dict[int, bytes] = {}
        # the long poll `agent/assignments/wait`: "push" answers at push() or its timeout;
        # "lost" never answers (until closed); "error" answers 500; "missing" 404 (an older
        # control plane)
        self.wait_mode = "push"
        self.pushes = 0  # push() calls so far
        self.waiting = 0  # long polls open now
        self.lock = threading.Lock()
        self.pushed = threading.Condition(self.lock)
        self.closed = False
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                kind = self.headers.get("Content-Type", "")
                if kind.startswith("application/json"):
                    return json.loads(raw or b"null")
                if kind.startswith("multipart/form-data"):
                    message = BytesParser(policy=HTTP).parsebytes(
                        b"Content-Type: " + kind.encode() + b"\r\n\r\n" + raw
                    )
                    return [
                        (
                            part.get_param("name", header="content-disposition"),
                            part.get_filename(),
                            part.get_payload(decode=True),
                        )
                        for part in message.iter_parts()
                    ]
                return raw

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _checkpoint(self, job):
                data = plane.checkpoints.get(job) or plane.outputs(job).get("checkpoint.tar")
                if data is None:
                    return self._answer(404, {"detail": "This job has no checkpoint."})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-tar")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _wait(self, query):
                """The long poll: {"changed": true} at the next push(), false at its timeout."""
                if plane.wait_mode == "missing":
                    return self._answer(404, {"detail": "Not found."})
                if plane.wait_mode == "error":
                    return self._answer(500, {"detail": "forced"})
                timeout = float(parse_qs(query).get("timeout", ["25"])[0])
                lost = plane.wait_mode == "lost"
                with plane.lock:
                    seen, plane.waiting = plane.pushes, plane.waiting + 1
                    plane.pushed.wait_for(
                        lambda: plane.closed or (not lost and plane.pushes != seen),
                        None if lost else timeout,
                    )
                    plane.waiting -= 1
                    changed = plane.pushes != seen and not plane.closed
                with contextlib.suppress(OSError):
                    self._answer(200, {"changed": changed})

            def _handle(self):
                body = self._body()
                path = self.path.removeprefix("/api/v1/").lstrip("/")
                route, _, query = path.partition("?")
                with plane.lock:
                    plane.requests.append((self.command, path, body))
                    plane.headers.append((path, dict(self.headers)))
                if route == "agent/assignments/wait":  # before `statuses`: the loop's own
                    if self.headers.get("Authorization") != f"Bearer {plane.credential}":
                        return self._answer(401, {"detail": "Node credential refused."})
                    return self._wait(query)
                with plane.lock:
                    forced = plane.statuses.pop(0) if plane.statuses else None
                if forced:
                    return self._answer(forced, {"detail": "forced"})
                if path == "enroll/":
                    node = {"id": plane.node_id, "name": body["name"], "pool": "test"}
                    answer = {"node": node, "credential": plane.credential}
                    answer["control_plane"] = plane.control_plane
                    return self._answer(201, answer | {"heartbeat_interval_s": 1})
                if path.startswith("data/"):  # a file an input URL names: no credential
                    plane.input_headers.append(dict(self.headers))
                    return self._answer(200, plane.answers.get(path, {}))
                if self.headers.get("Authorization") != f"Bearer {plane.credential}":
                    if plane.on_refused:
                        plane.on_refused()
                    return self._answer(401, {"detail": "Node credential refused."})
                if path == "agent/assignments":
                    return self._answer(200, plane.assignments)
                checkpoint = re.fullmatch(r"agent/jobs/(\d+)/checkpoint", path)
                if checkpoint:
                    return self._checkpoint(int(checkpoint.group(1)))
                if path == "agent/me":
                    node = {"id": plane.node_id, "name": "test-node", "pool": "test"}
                    return self._answer(200, node | {"control_plane": plane.control_plane})
                if path == "agent/credential/rotate":
                    plane.credential = "cpn_rotated"
                    return self._answer(201, {"credential": "cpn_rotated"})
                if (
                    path.endswith("/report")
                    and body.get("reason")
                    and body.get("step")
                    not in (
                        "pulling",
                        "failed",
                    )
                ):  # as the API: only a pull or a failure carries a reason
                    return self._answer(400, {"reason": ["Only a failure or a pull has one."]})
                if path.endswith("/report") and plane.on_report:
                    plane.on_report(body)
                if path.endswith("/report") and plane.unavailable_steps.get(body.get("step")):
                    plane.unavailable_steps[body["step"]] -= 1
                    return self._answer(503, {"code": "database_unavailable"})
                if path.endswith("/report") and body.get("step") in plane.refuse_steps:
                    return self._answer(409, {"code": "fencing_token_mismatch"})
                self._answer(200, plane.answers.get(path, {"ok": True}))

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def push(self) -> None:
        """A nudge to the node: every open long poll answers {"changed": true}."""
        with self.lock:
            self.pushes += 1
            self.pushed.notify_all()

    def sent(self, suffix: str) -> list:
        with self.lock:
            return [body for _, path, body in self.requests if path.endswith(suffix)]

    def reports(self, job: int) -> list[dict]:
        return self.sent(f"jobs/{job}/report")

    def steps(self, job: int) -> list[tuple[str, str]]:
        return [(r["step"], r.get("reason", "")) for r in self.reports(job)]

    def log_text(self, job: int) -> str:
        return "".join(body["text"] for body in self.sent(f"jobs/{job}/logs"))

    def outputs(self, job: int) -> dict[str, bytes]:
        files = {}
        for parts in self.sent(f"jobs/{job}/outputs"):
            files |= {filename: data for name, filename, data in parts if name == "files"}
        return files

    def close(self):
        with self.lock:  # open long polls end
            self.closed = True
            self.pushed.notify_all()
        self.server.shutdown()
        self.server.server_close()
