"""The control plane's HTTP API as the agent uses it: one requests Session, the node credential
as `Authorization: Bearer cpn_…` (re-read from the state dir on each call), every request signed
by the node's key (worker_agent/identity.py; each retry signed afresh, with a new nonce),
retries with exponential backoff on connection errors and 502/503/504, and one re-read of the
credential on a 401 (another thread may just have rotated it). Over https the API's certificate
is verified with `ca_file` (--ca-file) or the system's CAs; a certificate they do not trust is
not retried (it will not become trusted): ApiUnreachable at once, saying so."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import ssl
import threading

import requests
from urllib3.fields import RequestField
from urllib3.filepost import choose_boundary

from worker_agent import __version__
from worker_agent.identity import (
    UPLOAD_DIGEST,
    NodeKey,
    SignedBy,
    digest_field,
    rotation_statement,
)
from worker_agent.logs import mount_request_ids, valid_traceparent, with_request_id
from worker_agent.state import AgentState
from worker_agent.tarstream import ChunkReader

log = logging.getLogger(__name__)

RETRY_STATUSES = {502, 503, 504}
TRACES_KEPT = 10_000  # jobs whose trace context the client remembers


class ApiError(Exception):
    """The control plane answered with an error status (after retries, where they apply)."""

    def __init__(self, status: int, body, method: str = "", path: str = ""):
        self.status, self.body = status, body
        super().__init__(f"{method} {path} → {status}: {str(body)[:300]}")

    @property
    def code(self) -> str:
        """The API's reason code (409 `fencing_token_mismatch` …) when the body has one."""
        if isinstance(self.body, dict):
            for key in ("code", "reason"):
                if isinstance(self.body.get(key), str):
                    return self.body[key]
            detail = self.body.get("detail")
            if isinstance(detail, dict) and isinstance(detail.get("code"), str):
                return detail["code"]
        return ""


class ApiUnreachable(Exception):
    """No answer from the control plane after every retry."""


def untrusted_certificate(exc: BaseException) -> bool:
    """A failed certificate verification somewhere in what requests raised (urllib3 wraps
    ssl's error in its own, in a MaxRetryError's reason, in requests' SSLError)."""
    seen, todo = set(), [exc]
    while todo:
        error = todo.pop()
        if not isinstance(error, BaseException) or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, ssl.SSLCertVerificationError):
            return True
        todo += [error.__cause__, error.__context__, getattr(error, "reason", None), *error.args]
    return False


class ApiClient:
    def __init__(
        self,
        api: str,
        state: AgentState,
        *,
        key: NodeKey | None = None,
        timeout: float = 30,
        retries: int = 5,
        backoff: float = 0.5,
        backoff_max: float = 10,
        stop: threading.Event | None = None,
        ca_file: str | None = None,
    ):
        self.base = api.rstrip("/")
        if not self.base.endswith("/api/v1"):
            self.base += "/api/v1"
        self.state = state
        self.key = key  # None only in tests of a stand-in control plane that checks no signature
        self.timeout, self.retries = timeout, retries
        self.backoff, self.backoff_max = backoff, backoff_max
        self.stop = stop or threading.Event()
        # given on every request: requests lets REQUESTS_CA_BUNDLE override a Session's own
        self.verify = ca_file or True
        self._local = threading.local()  # a Session per thread: Sessions are not thread-safe
        # job → its `traceparent` (from its assignment), sent on the job's reports and uploads
        self._traces: dict[int, str] = {}

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.verify = self.verify
            session.headers["User-Agent"] = f"compute-pool-worker-agent/{__version__}"
            mount_request_ids(session)  # X-Request-ID on every call (worker_agent/logs.py)
        return session

    @with_request_id  # one id per call, its retries included, on its log lines too
    def request(
        self, method: str, path: str, *, auth: bool = True, retries: int | None = None, **kwargs
    ):
        """The decoded JSON answer (or text, or None for an empty body); raises ApiError on an
        error status and ApiUnreachable when every retry (`retries`, default the client's)
        failed to connect."""
        url = f"{self.base}/{path.lstrip('/')}"
        kwargs.setdefault("timeout", self.timeout)
        kwargs.setdefault("verify", self.verify)
        retries = self.retries if retries is None else retries
        reread = False
        attempt = 0
        extra = dict(kwargs.pop("headers", None) or {})  # sent again on every retry
        while True:
            headers = dict(extra)
            secret = self.state.credential() if auth else None
            if secret:
                headers["Authorization"] = f"Bearer {secret}"
            try:
                response = self.session.request(
                    method, url, headers=headers, auth=self._signed(), **kwargs
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                if untrusted_certificate(exc):
                    raise ApiUnreachable(self.untrusted(url, exc)) from exc
                response, error = None, exc
            else:
                error = None
            if response is not None and response.status_code == 401 and auth and not reread:
                # A rotation elsewhere may have replaced the credential: read it once more.
                reread = True
                log.warning("401 from %s %s; re-reading the credential", method, path)
                self._rewind(kwargs)
                continue
            if error is None and response.status_code not in RETRY_STATUSES:
                return self._decode(response, method, path)
            attempt += 1
            if attempt > retries or self.stop.is_set():
                if error is not None:
                    raise ApiUnreachable(f"{method} {url}: {error}") from error
                return self._decode(response, method, path)
            delay = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
            log.warning(
                "%s %s failed (%s); retry %d/%d in %.1fs",
                method,
                path,
                error or response.status_code,
                attempt,
                retries,
                delay,
            )
            self._rewind(kwargs)
            self.stop.wait(delay)

    def untrusted(self, url: str, exc: Exception) -> str:
        where = f"the CA bundle {self.verify}" if self.verify is not True else "the system's CAs"
        return (
            f"{url}: the API's TLS certificate is not trusted by {where} ({exc}); give the CA "
            "that signed it with --ca-file or WORKER_AGENT_CA_FILE"
        )

    def _signed(self) -> SignedBy | None:
        return SignedBy(self.key) if self.key is not None else None

    @staticmethod
    def _rewind(kwargs) -> None:
        """Files of a multipart upload are read again from the start on a retry."""
        for _field, (_name, handle, *_rest) in kwargs.get("files") or []:
            if hasattr(handle, "seek"):
                handle.seek(0)
        if isinstance(kwargs.get("data"), StreamedUpload):
            kwargs["data"].seek(0)

    @staticmethod
    def _decode(response: requests.Response, method: str, path: str):
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body, method, path)
        return body

    # ------------------------------------------------------------------ the agent API
    def enroll(self, body: dict) -> dict:
        return self.request("POST", "enroll/", json=body, auth=False)

    def me(self) -> dict:
        return self.request("GET", "agent/me")

    def heartbeat(self, body: dict) -> dict:
        return self.request("POST", "agent/heartbeat", json=body)

    def inventory(self, body: dict) -> dict:
        return self.request("POST", "agent/inventory", json=body)

    def rotate_credential(self) -> dict:
        return self.request("POST", "agent/credential/rotate")

    def rotate_key(self, new: NodeKey) -> dict:
        """Binds `new` in place of this client's key (the request is signed by the old one and
        carries the new one's proof); from then on requests are signed by `new`."""
        node = self.state.info().get("node_id")
        statement = rotation_statement(node, self.key.fingerprint, new.fingerprint)
        body = {"public_key": new.public_key, "proof": new.sign_bytes(statement)}
        answer = self.request("POST", "agent/key/rotate", json=body)
        self.key = new
        return answer

    def probe_result(self, probe: int, result: dict) -> dict:
        return self.request("POST", f"agent/probes/{int(probe)}/result", json={"result": result})

    def volumes(self, held: list[dict]) -> dict:
        """The persistent volumes held here; the answer's `remove` names the gone ones."""
        return self.request("POST", "agent/volumes", json={"volumes": held})

    def assignments(self) -> list[dict]:
        return self.request("GET", "agent/assignments") or []

    def wait_assignments(self, timeout: float) -> bool:
        """The long poll for a push (docs/data-plane.md "Assignments"): True once the control
        plane nudges this node, False after `timeout` seconds without one. One try: the
        caller backs off and asks again; ApiError 404 means a control plane without it."""
        answer = self.request(
            "GET",
            "agent/assignments/wait",
            params={"timeout": timeout},
            timeout=(min(self.timeout, 10), timeout + 10),  # connect, then read: the wait
            retries=0,
        )
        return isinstance(answer, dict) and answer.get("changed") is True

    def trace_job(self, job: int, traceparent: str) -> None:
        """The trace context of `job` (its assignment's `traceparent`): every report and upload
        of the job carries it as the `traceparent` header, so the control plane's log lines of
        those requests carry the job's trace id. An invalid one (valid_traceparent: not a
        string, malformed, a newline `requests` would refuse) is not kept: the job's requests
        then carry none."""
        traceparent = valid_traceparent(traceparent)
        if not traceparent:
            self._traces.pop(int(job), None)
            return
        self._traces.pop(int(job), None)
        self._traces[int(job)] = traceparent
        while len(self._traces) > TRACES_KEPT:  # the oldest jobs' go first
            self._traces.pop(next(iter(self._traces)))

    def _trace_headers(self, job: int) -> dict:
        traceparent = self._traces.get(int(job))
        return {"traceparent": traceparent} if traceparent else {}

    def report(self, job: int, body: dict) -> dict:
        return self.request(
            "POST", f"agent/jobs/{int(job)}/report", json=body, headers=self._trace_headers(job)
        )

    def logs(self, job: int, fencing_token: str, text: str) -> dict:
        body = {"fencing_token": fencing_token, "text": text}
        return self.request(
            "POST", f"agent/jobs/{int(job)}/logs", json=body, headers=self._trace_headers(job)
        )

    def output(
        self, job: int, fencing_token: str, name: str, size: int, opener, sha256: str | None = None
    ) -> dict:
        """One output streamed as the multipart upload `fencing_token` + `files`: `opener()`
        gives its data (exactly `size` bytes, in chunks) and is called again for a retry, so
        nothing of it is kept on the node or in memory."""
        body = StreamedUpload(fencing_token, name, size, opener)
        if sha256 is None:  # signed before the body goes: one whole read ahead of the upload
            digest = hashlib.sha256()
            for block in opener():
                digest.update(block)
            sha256 = digest.hexdigest()
        signed = digest_field(bytes.fromhex(sha256))
        headers = {"Content-Type": body.content_type, UPLOAD_DIGEST: signed}
        return self.request(
            "POST",
            f"agent/jobs/{int(job)}/outputs",
            data=body,
            headers=headers | self._trace_headers(job),
            timeout=max(self.timeout, 300),
        )

    def output_presign(
        self, job: int, fencing_token: str, name: str, size: int, sha256: str
    ) -> dict:
        """A presigned PUT of one output to the job's s3:// destination: {url, headers,
        location} (docs/storage.md); the bucket's credentials never come with it."""
        body = {"fencing_token": fencing_token, "name": name, "size": size, "sha256": sha256}
        return self.request(
            "POST",
            f"agent/jobs/{int(job)}/outputs/presign",
            json=body,
            headers=self._trace_headers(job),
        )

    def output_record(
        self, job: int, fencing_token: str, name: str, size: int, sha256: str
    ) -> dict:
        """Asks the control plane to record an output PUT by its presigned URL (it checks the
        object's size and sha256 with a HEAD: 409 `output_mismatch` otherwise)."""
        body = {"fencing_token": fencing_token, "name": name, "size": size, "sha256": sha256}
        return self.request(
            "POST",
            f"agent/jobs/{int(job)}/outputs/record",
            json=body,
            headers=self._trace_headers(job),
        )

    @contextlib.contextmanager
    def checkpoint(self, job: int, max_bytes: int):
        """The checkpoint of the job's earlier attempt (`GET agent/jobs/{id}/checkpoint`) as a
        Download: its chunks, read once, and their sha256 once read. Always from this API: the
        node credential goes nowhere else, whatever URL an assignment names. Raises ApiError
        (also when it is larger than `max_bytes`) or ApiUnreachable."""
        path = f"agent/jobs/{int(job)}/checkpoint"
        for attempt in range(self.retries + 1):
            if attempt:
                self.stop.wait(min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))
            headers = {"Authorization": f"Bearer {self.state.credential()}"}
            headers |= self._trace_headers(job)
            try:
                response = self.session.get(
                    f"{self.base}/{path}",
                    headers=headers,
                    auth=self._signed(),
                    stream=True,
                    timeout=self.timeout,
                    verify=self.verify,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                if untrusted_certificate(exc):
                    raise ApiUnreachable(self.untrusted(path, exc)) from exc
                if attempt >= self.retries or self.stop.is_set():
                    raise ApiUnreachable(f"GET {path}: {exc}") from exc
                continue
            with response:
                # a 401 may be a rotation by another thread: the next try re-reads it
                if response.status_code in RETRY_STATUSES | {401} and attempt < self.retries:
                    continue
                if response.status_code >= 400:
                    raise ApiError(response.status_code, response.text[:300], "GET", path)
                yield Download(response, max_bytes, path)
                return
        raise ApiUnreachable(f"GET {path}: no answer")


class Download:
    """A streamed answer's chunks, counted against a limit and hashed on the way."""

    def __init__(self, response, max_bytes: int, path: str):
        self._response, self.max_bytes, self.path = response, max_bytes, path
        self.digest, self.size = hashlib.sha256(), 0

    def chunks(self):
        try:
            for block in self._response.iter_content(1024 * 1024):
                self.size += len(block)
                if self.size > self.max_bytes:
                    raise ApiError(413, f"more than {self.max_bytes} bytes", "GET", self.path)
                self.digest.update(block)
                yield block
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ApiUnreachable(f"GET {self.path}: {exc}") from exc

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()


class StreamedUpload(ChunkReader):
    """A multipart body of one file whose length is known up front (so it goes out with a
    Content-Length, streamed): the `fencing_token` part, the file's part head, its data
    from `opener()`, the closing boundary. seek(0) (a retry) opens the data again."""

    def __init__(self, fencing_token: str, name: str, size: int, opener):
        boundary = choose_boundary()
        self.content_type = f"multipart/form-data; boundary={boundary}"
        token = RequestField(name="fencing_token", data=fencing_token)
        token.make_multipart()
        part = RequestField(name="files", data=b"", filename=name)
        part.make_multipart(content_type="application/octet-stream")
        self._head = (
            f"--{boundary}\r\n".encode()
            + token.render_headers().encode()
            + fencing_token.encode()
            + f"\r\n--{boundary}\r\n".encode()
            + part.render_headers().encode()
        )
        self._tail = f"\r\n--{boundary}--\r\n".encode()
        self.size, self._opener, self._source = size, opener, None
        self.len = len(self._head) + size + len(self._tail)  # requests' length
        self.seek(0)

    def seek(self, offset: int, whence: int = 0) -> int:
        if (offset, whence) != (0, 0):
            raise OSError("a streamed upload only rewinds to its start")
        self._start(itertools.chain([self._head], self._data(), [self._tail]))
        return 0

    def _data(self):
        sent = 0
        for block in self._opener():
            sent += len(block)
            if sent > self.size:
                raise OSError(f"the output grew past its {self.size} bytes")
            yield block
        if sent != self.size:
            raise OSError(f"the output has {sent} bytes, not {self.size}")
