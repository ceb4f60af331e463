"""WSGI entry point for the HTTP API under a threaded WSGI server (gunicorn gthread):
`gunicorn --worker-class gthread --threads 32 config.wsgi:application`.

Under ASGI every synchronous Django middleware and view hops between the event loop and a worker
thread (asgiref sync_to_async) on each request; a WSGI server runs the whole request on one
thread. The websocket routes (live events) stay on ASGI (config.asgi)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.wsgi import get_wsgi_application

from config.heap import freeze_startup_objects

application = get_wsgi_application()
freeze_startup_objects()
