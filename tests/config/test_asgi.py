"""The websocket handshake's sign-in (config/asgi.py, BearerOrSession), through the ASGI
application itself: a `Bearer` header signs in with an API token, any other Authorization
header (nginx's auth_basic in front) leaves the session to sign in, and a database that does
not answer while signing in ends the socket with the documented 1011, never an ASGI error
(the server's HTTP 500 on the handshake)."""

import base64

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.backends.db import SessionStore
from django.db import OperationalError
from django.test import Client

from config.asgi import application
from config.builders import build_token
from pools import authentication
from pools.consumers import AWAY, NOT_SIGNED_IN
from tests.live_events import own_channel_layer

pytestmark = pytest.mark.django_db(transaction=True)

BASIC = b"Basic " + base64.b64encode(b"proxy-user:proxy-password")


def session_cookie(user) -> bytes:
    browser = Client()
    browser.force_login(user)
    return f"sessionid={browser.cookies['sessionid'].value}".encode()


def handshake(path: str, headers: list[tuple[bytes, bytes]]):
    """(accepted, close code or None while the socket stays open) of a handshake to `path`."""

    async def scenario():
        socket = WebsocketCommunicator(application, path, headers=headers)
        accepted, _ = await socket.connect(timeout=10)
        if not accepted:
            return False, None
        if await socket.receive_nothing(timeout=1):
            await socket.disconnect()
            return True, None
        message = await socket.receive_output(timeout=5)
        return True, message.get("code")

    with own_channel_layer():
        return async_to_sync(scenario)()


def from_the_site(*headers: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"testserver"), (b"origin", b"http://testserver"), *headers]


def test_a_basic_authorization_header_leaves_the_session_to_sign_in(member):
    """nginx's auth_basic in front adds its own Authorization header to every request: the
    console's session still signs the socket in."""
    headers = from_the_site((b"cookie", session_cookie(member)), (b"authorization", BASIC))
    assert handshake("/ws/jobs/", headers) == (True, None)


def test_a_bearer_header_still_signs_in_with_its_token_alone(member):
    token = build_token(member).encode()
    assert handshake("/ws/jobs/", [(b"authorization", b"Bearer " + token)]) == (True, None)
    # a bad token is refused even with a session beside it: the token path was chosen
    headers = from_the_site(
        (b"cookie", session_cookie(member)), (b"authorization", b"Bearer cpu_unknown")
    )
    assert handshake("/ws/jobs/", headers) == (True, NOT_SIGNED_IN)


def test_a_socket_signed_in_by_a_session_closes_once_it_is_signed_out(member):
    """The session is read again with the consumer's periodic read (5 s): signed out (the
    session deleted), the open socket closes with 4401."""
    cookie = session_cookie(member)
    key = cookie.decode().partition("=")[2]

    async def scenario():
        socket = WebsocketCommunicator(
            application, "/ws/jobs/", headers=from_the_site((b"cookie", cookie))
        )
        accepted, _ = await socket.connect(timeout=10)
        assert accepted and await socket.receive_nothing(timeout=1)
        await database_sync_to_async(SessionStore(key).delete)()
        return await socket.receive_output(timeout=7)

    with own_channel_layer():
        closed = async_to_sync(scenario)()
    assert (closed["type"], closed["code"]) == ("websocket.close", NOT_SIGNED_IN)


def _database_away(*args, **kwargs):
    raise OperationalError("the database is away")


def test_a_database_away_while_a_token_is_looked_up_closes_with_1011(member, monkeypatch):
    token = build_token(member).encode()
    authentication.forget_tokens()
    monkeypatch.setattr(authentication, "_lookup", _database_away)
    assert handshake("/ws/jobs/", [(b"authorization", b"Bearer " + token)]) == (True, AWAY)


def test_a_database_away_while_a_session_is_read_closes_with_1011(member, monkeypatch):
    cookie = session_cookie(member)
    monkeypatch.setattr(SessionStore, "load", _database_away)
    assert handshake("/ws/jobs/", from_the_site((b"cookie", cookie))) == (True, AWAY)
