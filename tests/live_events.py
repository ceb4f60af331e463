"""Live-event tests over the real Redis channel layer, through the project's websocket routes.

Each scenario runs under a key prefix of its own, so parallel test runs (and the events other
tests publish) never reach its sockets. Use them in `django_db(transaction=True)` tests: events
are published on commit, and the consumers read the database from another thread.
"""

from __future__ import annotations

import copy
import uuid
from contextlib import contextmanager

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import override_settings

from config.routing import websocket_urlpatterns


@contextmanager
def own_channel_layer(hosts=None):
    """The project's channel layer (settings.CHANNEL_LAYERS: Redis at REDIS_URL, or `hosts`)
    under a fresh key prefix."""
    layer = copy.deepcopy(settings.CHANNEL_LAYERS["default"])
    layer["CONFIG"]["prefix"] = f"t{uuid.uuid4().hex}"
    if hosts:
        layer["CONFIG"]["hosts"] = hosts
    with override_settings(CHANNEL_LAYERS={"default": layer}):
        yield


async def follow(user, path: str) -> tuple[WebsocketCommunicator, bool, int | None]:
    """A websocket to `path` as `user` (signed in, as the session middleware would make it):
    (communicator, accepted, close code when refused)."""
    socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    socket.scope["user"] = user
    accepted, code = await socket.connect()
    return socket, accepted, None if accepted else code


async def followed(user, path: str) -> WebsocketCommunicator:
    socket, accepted, code = await follow(user, path)
    assert accepted, f"{user} was refused {path} ({code})"
    return socket


async def refused(user, path: str) -> int | None:
    """The close code `user` gets at `path` (the consumers accept and close at once, so that
    the browser sees the code), or None when the socket stays open."""
    socket, accepted, code = await follow(user, path)
    if not accepted:
        return code
    if await socket.receive_nothing(timeout=0.5):
        await socket.disconnect()
        return None
    message = await socket.receive_output()
    await socket.disconnect()  # the consumer ends (a left-over one hangs the loop's teardown)
    return message.get("code") if message["type"] == "websocket.close" else None
