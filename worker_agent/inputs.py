"""A job's inputs, fetched into the attempt's inputs/ before the job starts (docs/data-plane.md,
"Inputs"), never from the node's own network namespace.

The runtime gives the fetch a network namespace: under Docker the job's own (its network
owner's, after its egress rules are installed; for a job with no network, a throwaway one on the
pool network whose rules allow only its inputs' hosts). The fetch runs in a thread of the agent
that has entered that namespace (`setns(2)` acts on the calling thread only) and ends with the
fetch, so every socket of it, the DNS lookups' too, is subject to the job's iptables rules. The
process runtime, which isolates nothing, fetches from the node's namespace.

Every URL, each redirect's too, is resolved and ALL its addresses are checked against the data
plane's address rules (worker_agent/addresses.py) with the node's own addresses, the control
plane's and those the control plane sends added; the connection then goes to a checked address
(no second lookup between check and connect). An input the control plane presigned on an object
store it registered (`presigned: true`, its origin in `pool_network.object_store_endpoints`) is
exempt from the loopback rule: it is fetched from the node's namespace, where such a store
listens, without following redirects. A URL a tenant typed is never so marked.
"""

from __future__ import annotations

import ctypes
import http.client
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from worker_agent import __version__, addresses, input_cache, netpolicy
from worker_agent.outputs import plain_name
from worker_agent.runtime.base import Assignment, RuntimeFailure

log = logging.getLogger(__name__)

INPUT_MAX_BYTES = 4 * 1024**3
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
TIMEOUT_S = 60
CLONE_NEWNET = 0x40000000


class InputRefused(Exception):
    """The input cannot be fetched: a refused address, a bad URL, an HTTP error."""


@dataclass(frozen=True)
class Rules:
    private_allowed: bool = False
    refused: tuple = ()  # (why, network) pairs beyond the always-refused ones
    object_store_endpoints: tuple[str, ...] = ()  # origins, "http://127.0.0.1:9000"

    def check(self, host: str, port: int) -> list[tuple]:
        """The addresses `host` resolves to (getaddrinfo tuples), every one checked."""
        if problem := addresses.host_refusal(host):
            raise InputRefused(problem)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise InputRefused(f"{host} does not resolve: {exc}") from exc
        literal = addresses.ip_literal(host) is not None
        for info in infos:
            problem = addresses.refusal(
                info[4][0], private_allowed=self.private_allowed, refused=self.refused
            )
            if problem:
                raise InputRefused(problem if literal else f"{host} → {problem}")
        return infos


def rules_for(assignment: Assignment, api_url: str) -> Rules:
    """The rules of one attempt: the pool's knob and the refused addresses (netpolicy.refused:
    the node's, the control plane's, those it sends)."""
    pool = assignment.pool_network
    refused = netpolicy.refused(pool, api_url)
    return Rules(pool.private_ranges_allowed, refused, pool.object_store_endpoints)


@dataclass(frozen=True)
class Fetcher:
    """What a runtime's `create` gets to fetch an attempt's inputs: the rules (its egress
    bounds use the same refused addresses) and `run(netns)`, which fetches them all in the
    network namespace at path `netns` (None: the caller's); `hosts`, the `host:port` of each
    input fetched in a namespace (what a throwaway one's egress rules allow)."""

    rules: Rules
    run: Callable[[str | None], None]
    hosts: tuple[str, ...] = ()

    @classmethod
    def for_attempt(cls, assignment: Assignment, workdir: Path, api_url: str) -> Fetcher:
        rules = rules_for(assignment, api_url)
        return cls(
            rules,
            lambda netns: fetch_all(assignment, workdir, netns=netns, rules=rules),
            tuple(hosts(assignment, rules)),
        )


def origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}".lower()


def is_presigned(item: dict, rules: Rules) -> bool:
    """Marked by the control plane AND on an origin it registered."""
    registered = {origin(endpoint) for endpoint in rules.object_store_endpoints}
    return item.get("presigned") is True and origin(str(item.get("url", ""))) in registered


def entries(assignment: Assignment) -> list[dict]:
    """The assignment's inputs as {url, name, presigned}; a bad one fails the attempt."""
    out = []
    for index, entry in enumerate(assignment.inputs):
        item = entry if isinstance(entry, dict) else {"url": entry}
        url = str(item.get("url", ""))
        name = str(item.get("name") or url.rstrip("/").rpartition("/")[2] or f"input{index}")
        if not plain_name(name) or not url.startswith(("http://", "https://")):
            raise RuntimeFailure("runtime_error", f"input {index}: refused {url!r} / {name!r}")
        out.append({"url": url, "name": name, "presigned": item.get("presigned") is True})
    return out


def hosts(assignment: Assignment, rules: Rules) -> list[str]:
    """The `host:port` entries of the inputs fetched in a namespace (for the egress rules of
    a throwaway one)."""
    found = []
    for item in entries(assignment):
        if not is_presigned(item, rules):
            parts = urlsplit(item["url"])
            port = parts.port or (443 if parts.scheme == "https" else 80)
            host = parts.hostname or ""
            found.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return list(dict.fromkeys(found))


def fetch_all(assignment: Assignment, workdir: Path, *, netns: str | None, rules: Rules) -> None:
    """Every input into workdir/inputs/<name>: the tenant's in the network namespace at path
    `netns` (None: this one, for the process runtime), the presigned ones from here."""
    items = entries(assignment)
    presigned = [item for item in items if is_presigned(item, rules)]
    others = [item for item in items if not is_presigned(item, rules)]
    for item in presigned:
        _fetch_into(item, workdir, rules, presigned=True)
    if not others:
        return

    def work():
        for item in others:
            _fetch_into(item, workdir, rules, presigned=False)

    if netns is None:
        work()
    else:
        in_namespace(netns, work)


def _fetch_into(item: dict, workdir: Path, rules: Rules, *, presigned: bool) -> None:
    """One input; a presigned one (is_presigned) unchecked, and its redirects not followed.
    With the node's input cache (worker_agent/input_cache.py), an entry of the same object is
    revalidated by a conditional GET made exactly as the download (304: filled from the
    cache), and a download with a validator is kept for the next attempt."""
    name, target, size = item["name"], workdir / "inputs" / item["name"], 0
    cache = input_cache.active()
    key = input_cache.key_for(item["url"], presigned=presigned) if cache else ""
    entry = cache.lookup(key) if cache else None
    started = time.monotonic()
    try:
        response = open_checked(
            item["url"],
            rules,
            follow=not presigned,
            checked=not presigned,
            headers=entry.validators() if entry else None,
        )
        if entry is not None and response.status == 304:
            response.close()
            cache.fill(entry, target)
            return
        keep = input_cache.cacheable(response.headers) if cache and response.status == 200 else None
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with response, os.fdopen(fd, "wb") as f:
            while block := response.read(1024 * 1024):
                size += len(block)
                if size > INPUT_MAX_BYTES:
                    raise InputRefused(f"larger than {INPUT_MAX_BYTES} bytes")
                f.write(block)
    except (InputRefused, OSError, http.client.HTTPException, ssl.SSLError) as exc:
        raise RuntimeFailure("runtime_error", f"input {name}: {exc}") from exc
    os.chmod(target, 0o644)
    if cache:
        cache.record_download(key, size, time.monotonic() - started)
        if keep is not None:
            try:
                cache.store(key, target, keep)
            except OSError as exc:  # the cache is an optimisation: the attempt goes on
                log.warning("input %s not cached: %s", name, exc)
        elif entry is not None:
            cache.forget(key)  # the server no longer allows keeping it


def open_checked(
    url: str, rules: Rules, *, follow: bool = True, checked: bool = True, headers=None
):
    """The response to GET `url` (status 2xx), every hop resolved, checked and connected to
    the checked address; redirects followed (at most MAX_REDIRECTS) only when `follow`.
    `headers`: a conditional request's validators (the input cache's), then 304 is answered
    too."""
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputRefused(f"{url[:200]!r}: only http(s) URLs with a host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = rules.check(parts.hostname, port) if checked else _lookup(parts.hostname, port)
        connection = _pinned(parts.scheme, parts.hostname, port, infos)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = {"User-Agent": f"compute-pool-worker-agent/{__version__}", **(headers or {})}
        connection.request("GET", path, headers=sent)
        response = connection.getresponse()
        location = response.getheader("Location")
        if response.status in REDIRECTS and location:
            response.close()
            connection.close()
            if not follow:
                raise InputRefused(f"HTTP {response.status}: redirects are not followed here")
            url = urljoin(url, location)
            continue
        if headers and response.status == 304:
            return response
        if not 200 <= response.status < 300:
            response.close()
            connection.close()
            raise InputRefused(f"HTTP {response.status} {response.reason}")
        return response
    raise InputRefused(f"more than {MAX_REDIRECTS} redirects")


def _lookup(host: str, port: int) -> list[tuple]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InputRefused(f"{host} does not resolve: {exc}") from exc


def _pinned(scheme: str, host: str, port: int, infos) -> http.client.HTTPConnection:
    """A connection to `host` (its name in the Host header, TLS SNI and certificate check)
    whose socket goes only to the addresses already checked."""
    if scheme == "https":
        connection = http.client.HTTPSConnection(
            host, port, timeout=TIMEOUT_S, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)

    def connect(_address, timeout=TIMEOUT_S, source_address=None):
        error = None
        for family, kind, proto, _, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"{host}: no address")

    connection._create_connection = connect
    return connection


def in_namespace(path: str, work):
    """`work()` in a new thread that first enters the network namespace at `path`
    (`/proc/<pid>/ns/net`, `/run/netns/<name>`); its result, or its exception re-raised. The
    thread ends with it: no other work ever runs in that namespace."""
    result: dict = {}

    def run():
        try:
            enter(path)
            result["value"] = work()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="netns")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def enter(path: str) -> None:
    """setns(2) the calling thread into the network namespace at `path` (root only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise RuntimeFailure("runtime_error", f"the job's network namespace: {exc}") from exc
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            problem = os.strerror(ctypes.get_errno())
            raise RuntimeFailure("runtime_error", f"cannot enter the job's namespace: {problem}")
    finally:
        os.close(fd)
