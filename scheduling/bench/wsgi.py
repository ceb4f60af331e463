"""WSGI entry point for serving the HTTP API with a threaded WSGI server (gunicorn gthread).

Under ASGI, every synchronous Django middleware and view hops between the event loop and a
worker thread (asgiref sync_to_async) on each request; a WSGI server runs the whole request on
one thread. The websocket routes stay on ASGI (config.asgi)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
