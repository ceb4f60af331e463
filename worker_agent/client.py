"""The control plane's HTTP API as the agent uses it: one requests Session, the node credential
as `Authorization: Bearer cpn_…` (re-read from the state dir on each call), retries with
exponential backoff on connection errors and 502/503/504, and one re-read of the credential
on a 401 (another thread may just have rotated it)."""

from __future__ import annotations

import hashlib
import logging
import threading

import requests

from worker_agent import __version__
from worker_agent.state import AgentState

log = logging.getLogger(__name__)

RETRY_STATUSES = {502, 503, 504}


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


class ApiClient:
    def __init__(
        self,
        api: str,
        state: AgentState,
        *,
        timeout: float = 30,
        retries: int = 5,
        backoff: float = 0.5,
        backoff_max: float = 10,
        stop: threading.Event | None = None,
    ):
        self.base = api.rstrip("/")
        if not self.base.endswith("/api/v1"):
            self.base += "/api/v1"
        self.state = state
        self.timeout, self.retries = timeout, retries
        self.backoff, self.backoff_max = backoff, backoff_max
        self.stop = stop or threading.Event()
        self._local = threading.local()  # a Session per thread: Sessions are not thread-safe

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.headers["User-Agent"] = f"compute-pool-worker-agent/{__version__}"
        return session

    def request(self, method: str, path: str, *, auth: bool = True, **kwargs):
        """The decoded JSON answer (or text, or None for an empty body); raises ApiError on an
        error status and ApiUnreachable when every retry failed to connect."""
        url = f"{self.base}/{path.lstrip('/')}"
        kwargs.setdefault("timeout", self.timeout)
        reread = False
        attempt = 0
        while True:
            headers = dict(kwargs.pop("headers", None) or {})
            secret = self.state.credential() if auth else None
            if secret:
                headers["Authorization"] = f"Bearer {secret}"
            try:
                response = self.session.request(method, url, headers=headers, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
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
            if attempt > self.retries or self.stop.is_set():
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
                self.retries,
                delay,
            )
            self._rewind(kwargs)
            self.stop.wait(delay)

    @staticmethod
    def _rewind(kwargs) -> None:
        """Files of a multipart upload are read again from the start on a retry."""
        for _field, (_name, handle, *_rest) in kwargs.get("files") or []:
            if hasattr(handle, "seek"):
                handle.seek(0)

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

    def probe_result(self, probe: int, result: dict) -> dict:
        return self.request("POST", f"agent/probes/{int(probe)}/result", json={"result": result})

    def assignments(self) -> list[dict]:
        return self.request("GET", "agent/assignments") or []

    def report(self, job: int, body: dict) -> dict:
        return self.request("POST", f"agent/jobs/{int(job)}/report", json=body)

    def logs(self, job: int, fencing_token: str, text: str) -> dict:
        body = {"fencing_token": fencing_token, "text": text}
        return self.request("POST", f"agent/jobs/{int(job)}/logs", json=body)

    def outputs(self, job: int, fencing_token: str, files: list) -> dict:
        """`files`: (name, open binary file) pairs, sent as multipart `files` parts."""
        parts = [("files", (name, handle, "application/octet-stream")) for name, handle in files]
        return self.request(
            "POST",
            f"agent/jobs/{int(job)}/outputs",
            data={"fencing_token": fencing_token},
            files=parts,
            timeout=max(self.timeout, 300),
        )

    def checkpoint(self, job: int, target, max_bytes: int) -> str:
        """Streams the checkpoint of the job's earlier attempt (`GET agent/jobs/{id}/checkpoint`)
        into the file `target`; its sha256 (hex). Always from this API: the node credential
        goes nowhere else, whatever URL an assignment names. Raises ApiError (also when it is
        larger than `max_bytes`) or ApiUnreachable."""
        path = f"agent/jobs/{int(job)}/checkpoint"
        for attempt in range(self.retries + 1):
            if attempt:
                self.stop.wait(min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))
            headers = {"Authorization": f"Bearer {self.state.credential()}"}
            try:
                with self.session.get(
                    f"{self.base}/{path}", headers=headers, stream=True, timeout=self.timeout
                ) as response:
                    # a 401 may be a rotation by another thread: the next try re-reads it
                    if response.status_code in RETRY_STATUSES | {401} and attempt < self.retries:
                        continue
                    if response.status_code >= 400:
                        raise ApiError(response.status_code, response.text[:300], "GET", path)
                    digest, size = hashlib.sha256(), 0
                    with open(target, "wb") as f:
                        for block in response.iter_content(1024 * 1024):
                            size += len(block)
                            if size > max_bytes:
                                raise ApiError(413, f"more than {max_bytes} bytes", "GET", path)
                            digest.update(block)
                            f.write(block)
                    return digest.hexdigest()
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt >= self.retries or self.stop.is_set():
                    raise ApiUnreachable(f"GET {path}: {exc}") from exc
        raise ApiUnreachable(f"GET {path}: no answer")
