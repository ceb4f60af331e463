"""Django's ASGI handler, with one thread hop per request to a synchronous view.

Under ASGI Django runs its middleware chain in the event loop and every synchronous part of it
in a worker thread: each of Django's own middlewares (MiddlewareMixin) hops to a thread and
back for its `process_request` and `process_response`, and a synchronous middleware in the
middle of the chain (ours, RejectNulMiddleware) turns the rest back into async, so a request
to a synchronous view made a dozen hops, each a handover through a condition variable. Served
by hypercorn, a lease grant cost about three times the CPU it costs under a WSGI server
(docs/benchmarks.md, "The web role under hypercorn").

Every view of the API and the console is synchronous but the agents' long poll (an async view:
it waits without holding a thread). So this handler keeps a second, synchronous chain of the
same middlewares (a WSGI handler's, `BaseHandler.load_middleware(is_async=False)`) and sends a
request whose view is synchronous through it in one `sync_to_async` call, thread-sensitive like
Django's own (the request's database connection stays in that one thread, with the request's
started/finished signals); a request to an async view takes Django's async chain as before.
"""

from __future__ import annotations

import functools

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler
from django.urls import Resolver404, get_resolver, get_urlconf

CACHED_PATH_MAX = 200  # the longest path whose view's kind is kept (below)


class _SyncChain(BaseHandler):
    def __init__(self):
        super().__init__()
        self.load_middleware(is_async=False)


class OneHopASGIHandler(ASGIHandler):
    def __init__(self):
        super().__init__()
        self.sync_chain = _SyncChain()

    async def get_response_async(self, request):
        if _view_is_async(request):
            return await super().get_response_async(request)
        return await sync_to_async(self.sync_chain.get_response, thread_sensitive=True)(request)


def _view_is_async(request) -> bool:
    """Whether the view the request's path resolves to is a coroutine function (Django marks
    an async class-based view's as_view so); a path of no view is answered by the sync chain."""
    urlconf, path = get_urlconf() or settings.ROOT_URLCONF, request.path_info
    if len(path) > CACHED_PATH_MAX:  # resolved each time: 4,096 long ones kept would be MBs
        return _resolve_to_async(urlconf, path)
    return _cached_resolve_to_async(urlconf, path)


def _resolve_to_async(urlconf: str, path: str) -> bool:
    try:
        match = get_resolver(urlconf).resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


# by path: the fleet's requests are few paths (every agent polls the same one), and a resolve
# was 7 % of a grant's CPU
_cached_resolve_to_async = functools.lru_cache(maxsize=4096)(_resolve_to_async)
