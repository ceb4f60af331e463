"""ASGI entry point: HTTP through Django, websockets through Channels (live events)."""

import os
from types import SimpleNamespace

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django
from channels.auth import AuthMiddleware
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

django.setup(set_prefix=False)  # what get_asgi_application() does before its handler

from config.asgi_handler import OneHopASGIHandler  # noqa: E402

django_asgi_app = OneHopASGIHandler()
if settings.DEBUG:  # `make run` serves the console's static files itself
    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.db import database_sync_to_async  # noqa: E402
from django.contrib.auth.models import AnonymousUser  # noqa: E402
from rest_framework.exceptions import AuthenticationFailed  # noqa: E402

from config.heap import freeze_startup_objects  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from config.timeouts import BodyTimeout  # noqa: E402
from pools.authentication import ApiTokenAuthentication  # noqa: E402
from pools.consumers import AWAY_ERRORS, close_away  # noqa: E402


async def lifespan(scope, receive, send):
    """The server's start and stop (hypercorn announces both): nothing to do at either."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _token_user(header: str) -> tuple:
    """(user, token) of an `Authorization: Bearer cpu_…` value, by the API's own checks (known,
    not revoked, not expired, its person active); (anonymous, None) when they refuse it."""
    request = SimpleNamespace(headers={"authorization": header})
    try:
        found = ApiTokenAuthentication().authenticate(request)
    except AuthenticationFailed:
        found = None
    return found or (AnonymousUser(), None)


def _is_bearer(header: bytes | None) -> bool:
    """An `Authorization: Bearer …` value (the scheme in any case, as HTTP has it)."""
    scheme, _, _ = (header or b"").strip().partition(b" ")
    return scheme.lower() == b"bearer"


class SessionAuth(AuthMiddleware):
    """Channels' AuthMiddleware (the session's person into scope["user"]), whose reads of the
    session and the user meeting a database that does not answer end the socket with 1011, the
    close code the client reconnects on, instead of an exception (the server's HTTP 500)."""

    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        self.populate_scope(scope)
        try:
            await self.resolve_scope(scope)
        except AWAY_ERRORS as error:
            return await close_away(send, error)
        return await self.inner(scope, receive, send)


class BearerOrSession:
    """A websocket handshake that carries `Authorization: Bearer <token>` signs in with that API
    token (a CLI, a script, the drill's followers); the consumer checks the token's scopes. One
    without (or with another scheme: nginx's auth_basic in front adds `Basic`) signs in with the
    browser's session cookie, from an allowed origin only: a page of another site cannot set a
    handshake's headers, only make the browser send its cookie. A database that does not answer
    while signing in ends the socket with 1011 (docs/api.md "Live events")."""

    def __init__(self, inner):
        self.inner = inner
        self.session = AllowedHostsOriginValidator(
            CookieMiddleware(SessionMiddleware(SessionAuth(inner)))
        )

    async def __call__(self, scope, receive, send):
        header = dict(scope.get("headers", ())).get(b"authorization")
        if not _is_bearer(header):
            return await self.session(scope, receive, send)
        try:
            user, token = await database_sync_to_async(_token_user)(header.decode("latin-1"))
        except AWAY_ERRORS as error:
            return await close_away(send, error)
        return await self.inner(dict(scope, user=user, token=token), receive, send)


application = ProtocolTypeRouter(
    {
        "lifespan": lifespan,
        "http": BodyTimeout(django_asgi_app, settings.HTTP_BODY_TIMEOUT_S),
        "websocket": BearerOrSession(URLRouter(websocket_urlpatterns)),
    }
)
freeze_startup_objects()
