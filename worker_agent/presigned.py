"""A PUT of one output to a presigned URL of an object store the control plane registered
(docs/storage.md, "Object stores: buckets, inputs and outputs").

The agent never holds a bucket's credentials: the control plane signs each PUT for one key, the
file's size and its sha256 (object metadata), and the agent sends exactly those headers and
bytes. Only to an origin of the assignment's `pool_network.object_store_endpoints`, from the
node's own namespace (where such a store listens, like presigned inputs), without following
redirects. The URL carries a signature: it is never logged.
"""

from __future__ import annotations

import http.client
import ssl
from urllib.parse import urlsplit

from worker_agent import __version__

TIMEOUT_S = 120


class PutRefused(Exception):
    """The store refused the PUT, or the URL is not one the agent may send to."""


def origin(url: str) -> str:
    """scheme://host:port, the port explicit (worker_agent/inputs.py's form)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}".lower()


def registered(url: str, endpoints) -> bool:
    """`url` is http(s) on an origin of `endpoints` (the assignment's object stores)."""
    if urlsplit(url).scheme not in ("http", "https"):
        return False
    return origin(url) in {origin(str(endpoint)) for endpoint in endpoints or ()}


def put(url: str, headers: dict, size: int, chunks, *, endpoints) -> None:
    """PUTs exactly `size` bytes from the iterator `chunks` with `headers` (all of them signed
    in); raises PutRefused (the store's status) or OSError."""
    if not registered(url, endpoints):
        raise PutRefused("the presigned URL is on no registered object store")
    parts = urlsplit(url)
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=TIMEOUT_S, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    try:
        connection.putrequest(
            "PUT", f"{parts.path or '/'}?{parts.query}", skip_accept_encoding=True
        )
        sent_headers = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
        sent_headers["content-length"] = str(size)
        sent_headers.setdefault("user-agent", f"compute-pool-worker-agent/{__version__}")
        for name, value in sent_headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        sent = 0
        for block in chunks:
            sent += len(block)
            if sent > size:
                raise OSError(f"the output grew past its {size} bytes")
            connection.send(block)
        if sent != size:
            raise OSError(f"the output has {sent} bytes, not {size}")
        response = connection.getresponse()
        body = response.read(2048)
        if not 200 <= response.status < 300:
            raise PutRefused(f"the store answered {response.status}: {_code(body)}")
    except (http.client.HTTPException, ssl.SSLError) as exc:
        raise OSError(f"PUT to the object store: {type(exc).__name__}: {exc}") from exc
    finally:
        connection.close()


def _code(body: bytes) -> str:
    """The S3 error code of an XML error body (never the body itself: it may echo the URL)."""
    text = body.decode("utf-8", "replace")
    start = text.find("<Code>")
    end = text.find("</Code>", start)
    return text[start + 6 : end][:60] if start >= 0 and end > start else "no error code"
