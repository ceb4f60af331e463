"""The ASGI handler (config/asgi_handler.py): a request to a synchronous view goes through a
synchronous copy of the middleware chain in one thread hop; it must answer exactly what Django's
own ASGI handler answers (every middleware's headers, its refusals, the API's errors, the
console's cookies), and a request to the async long poll still takes the async chain."""

import json
import re

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from channels.testing import HttpCommunicator
from django.core.handlers.asgi import ASGIHandler

from config.asgi import application
from config.asgi_handler import OneHopASGIHandler, _view_is_async
from config.builders import build_token

pytestmark = pytest.mark.django_db(transaction=True)

VARYING = {b"date", b"expires", b"set-cookie"}  # the clock, a new CSRF cookie
CSRF_TOKEN = re.compile(rb'(?<=csrfmiddlewaretoken" value=")[^"]+|(?<="X-CSRFToken": ")[^"]+')


def answer(app, method: str, path: str, body: bytes = b"", headers=()) -> dict:
    headers = [(b"host", b"testserver"), (b"x-request-id", b"req-asgi-1"), *headers]
    query = b""
    if "?" in path:
        path, _, raw = path.partition("?")
        query = raw.encode()

    async def scenario():
        communicator = HttpCommunicator(app, method, path, body=body, headers=headers)
        communicator.scope["query_string"] = query
        return await communicator.get_response(timeout=20)

    response = async_to_sync(scenario)()
    header_map = {}
    for name, value in response["headers"]:
        header_map.setdefault(name.lower(), []).append(value)
    return {
        "status": response["status"],
        "headers": {k: v for k, v in header_map.items() if k not in VARYING},
        "cookies": sorted(v.split(b"=")[0] for v in header_map.get(b"set-cookie", [])),
        "body": CSRF_TOKEN.sub(b"", response["body"]),  # new on every answer
    }


def requests(token: str) -> list[tuple]:
    bearer = [(b"authorization", f"Bearer {token}".encode())]
    as_json = [*bearer, (b"content-type", b"application/json")]
    return [
        ("GET", "/api/v1/no-such-thing", b"", ()),
        ("GET", "/api/v1/jobs/", b"", ()),  # no credential
        ("GET", "/api/v1/jobs/", b"", bearer),
        ("POST", "/api/v1/jobs/", b"{not json", as_json),
        ("POST", "/api/v1/jobs/", json.dumps({"name": "x"}).encode(), as_json),
        ("GET", "/api/v1/jobs/?name=a%00b", b"", bearer),  # RejectNulMiddleware
        ("GET", "/accounts/login/", b"", ()),  # the console: CSRF cookie, frame options
        ("GET", "/no-such-page/", b"", ()),
    ]


def test_a_synchronous_view_answers_as_under_django_s_own_handler(member):
    token = build_token(member)
    ours, django = OneHopASGIHandler(), ASGIHandler()
    for method, path, body, headers in requests(token):
        mine, theirs = (answer(app, method, path, body, headers) for app in (ours, django))
        assert mine == theirs, (method, path)
        assert mine["headers"][b"x-request-id"] == [b"req-asgi-1"]
        assert mine["status"] < 500, (method, path, mine["body"][:300])


def test_only_the_long_poll_takes_the_async_chain():
    class Request:
        def __init__(self, path):
            self.path_info = path

    assert _view_is_async(Request("/api/v1/agent/assignments/wait"))
    long_path = "/api/v1/jobs/1/outputs/" + "x" * 300  # resolved, not kept
    for path in ("/api/v1/jobs/", "/api/v1/agent/assignments", "/accounts/login/", "/nope/"):
        assert not _view_is_async(Request(path)), path
    assert not _view_is_async(Request(long_path))


def hops(app, token: str) -> int:
    """How many times a GET of /api/v1/jobs/ handed work from the event loop to a thread."""
    calls = []
    original = SyncToAsync.__call__

    def counted(self, *args, **kwargs):
        calls.append(getattr(self.func, "__qualname__", repr(self.func)))
        return original(self, *args, **kwargs)

    bearer = [(b"authorization", f"Bearer {token}".encode())]
    SyncToAsync.__call__ = counted
    try:
        assert answer(app, "GET", "/api/v1/jobs/", headers=bearer)["status"] == 200
    finally:
        SyncToAsync.__call__ = original
    return len(calls)


def test_a_synchronous_view_and_its_whole_chain_run_in_one_hop_to_a_thread(member):
    """Through the product's ASGI application (config/asgi.py), as hypercorn calls it: the
    request's started and finished signals and the chain with its view, three hops; Django's
    own handler makes a dozen or more for the same request (each middleware's request and
    response halves)."""
    token = build_token(member)
    ours, django = hops(application, token), hops(ASGIHandler(), token)
    assert ours <= 3 and django >= 10, (ours, django)
