"""Issue 17, slow clients: connections that send their request line, headers or body slowly are
cut off by the real web server process (as `make run` starts it), and another client's request
stays fast meanwhile. Before, under daphne, 250 such connections stayed open for more than 30 s:
Twisted's only timeout is an idle one that every byte resets.

The server runs with 2 s timeouts here (HTTP_HEADER_TIMEOUT_S, HTTP_BODY_TIMEOUT_S; 10 s by
default) so that the module takes seconds."""

import json
import selectors
import socket
import time
import urllib.request

import pytest

from tests.web_server import web_server

TIMEOUT_S = 2.0
SLACK_S = 2.5  # the server's timer, and a loaded 2-core CI machine


@pytest.fixture(scope="module")
def server(django_db_setup):
    with web_server(
        HTTP_HEADER_TIMEOUT_S=str(TIMEOUT_S), HTTP_BODY_TIMEOUT_S=str(TIMEOUT_S)
    ) as url:
        yield url


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_after(conns: dict[socket.socket, bytes], limit: float, drip_every: float = 0.25):
    """Send each connection its next byte every `drip_every` s (so an idle timeout alone never
    fires) until the server closes it; {connection: (seconds until closed, what it answered)}."""
    start = time.monotonic()
    selector = selectors.DefaultSelector()
    for conn in conns:
        conn.setblocking(False)
        selector.register(conn, selectors.EVENT_READ)
    answered = {conn: b"" for conn in conns}
    closed: dict[socket.socket, tuple[float, bytes]] = {}
    next_drip = start
    while len(closed) < len(conns) and time.monotonic() - start < limit:
        if time.monotonic() >= next_drip:
            next_drip += drip_every
            for conn, rest in list(conns.items()):
                if conn not in closed and rest:
                    try:
                        conn.send(rest[:1])
                    except OSError:
                        closed[conn] = (time.monotonic() - start, answered[conn])
                        continue
                    conns[conn] = rest[1:]
        for key, _ in selector.select(timeout=0.05):
            conn = key.fileobj
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            answered[conn] += data
            if not data:
                closed[conn] = (time.monotonic() - start, answered[conn])
                selector.unregister(conn)
    for conn in conns:
        conn.close()
    return closed


def _get_ms(url: str) -> float:
    start = time.monotonic()
    with urllib.request.urlopen(f"{url}/accounts/login/", timeout=10) as response:
        assert response.status == 200
        response.read()
    return (time.monotonic() - start) * 1000


def test_slow_request_lines_and_headers_are_cut_off_and_others_stay_fast(server):
    host = server.removeprefix("http://")
    # bytes enough that the drip outlasts the timeout many times over
    slow = {
        _connect(server): b"GET /accounts/login/" + b"x" * 200,  # the request line
        **{
            _connect(server): f"GET /accounts/login/ HTTP/1.1\r\nHost: {host}\r\n".encode()
            + b"X-Slow: " * 100  # the headers, one byte at a time
            for _ in range(30)
        },
    }
    before = time.monotonic()
    closed = _closed_after(slow, limit=TIMEOUT_S + SLACK_S + 5)
    assert len(closed) == len(slow), f"{len(slow) - len(closed)} slow connections still open"
    assert max(seconds for seconds, _ in closed.values()) < TIMEOUT_S + SLACK_S
    assert min(seconds for seconds, _ in closed.values()) > TIMEOUT_S * 0.8  # the deadline
    assert time.monotonic() - before < TIMEOUT_S + SLACK_S + 1
    # meanwhile (and after) the server answers everyone else at once
    assert max(_get_ms(server) for _ in range(5)) < 1000


def test_the_slow_clients_do_not_slow_a_normal_request(server):
    host = server.removeprefix("http://")
    slow = [_connect(server) for _ in range(100)]
    for conn in slow:
        conn.sendall(f"GET /accounts/login/ HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode())
    try:
        timings = [_get_ms(server) for _ in range(5)]
    finally:
        for conn in slow:
            conn.close()
    assert max(timings) < 1000, timings


def test_an_idle_keep_alive_connection_is_closed(server):
    host = server.removeprefix("http://")
    conn = _connect(server)
    conn.sendall(f"GET /accounts/login/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    closed = _closed_after({conn: b""}, limit=TIMEOUT_S + SLACK_S + 5)
    ((seconds, answered),) = closed.values()
    assert answered.startswith(b"HTTP/1.1 200")  # served, then closed once idle
    assert seconds < TIMEOUT_S + SLACK_S


def _post(host: str, length: int) -> bytes:
    return (
        f"POST /api/v1/jobs/ HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_stalled_body_gets_a_408_and_is_closed(server):
    conn = _connect(server)
    conn.sendall(_post(server.removeprefix("http://"), 1000) + b'{"name": ')  # then nothing
    closed = _closed_after({conn: b""}, limit=TIMEOUT_S + SLACK_S + 5)
    ((seconds, answered),) = closed.values()
    head, _, body = answered.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answered[:300]
    assert json.loads(body)["code"] == "request_timeout"
    assert TIMEOUT_S * 0.8 < seconds < TIMEOUT_S + SLACK_S


def test_a_slow_body_that_keeps_coming_is_read_to_the_end(server):
    # a byte every 0.5 s, 7 s in all: far longer than the body timeout, which is per chunk
    body = json.dumps({"name": "xxxx"}).encode()
    conn = _connect(server)
    conn.sendall(_post(server.removeprefix("http://"), len(body)))
    closed = _closed_after(
        {conn: body}, limit=len(body) * 0.5 + TIMEOUT_S + SLACK_S + 5, drip_every=0.5
    )
    ((_, answered),) = closed.values()  # answered, then closed once idle
    assert answered.startswith(b"HTTP/1.1 401"), answered[:300]  # the API read it: no token
