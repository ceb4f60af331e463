"""ASGI entry point: HTTP through Django, websockets through Channels (live events)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()
if settings.DEBUG:  # `make run` serves the console's static files itself
    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from config.heap import freeze_startup_objects  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from config.timeouts import BodyTimeout  # noqa: E402


async def lifespan(scope, receive, send):
    """The server's start and stop (hypercorn announces both): nothing to do at either."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


application = ProtocolTypeRouter(
    {
        "lifespan": lifespan,
        "http": BodyTimeout(django_asgi_app, settings.HTTP_BODY_TIMEOUT_S),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
freeze_startup_objects()
