"""Transport guards that hold before any view runs (issue 9): NUL characters, and no redirects
or HTML error pages under /api/."""

from django.contrib.messages.middleware import MessageMiddleware
from django.http import HttpResponseBadRequest, JsonResponse
from django.middleware import common

from pools.api.errors import error_body

API_PREFIX = "/api/"


def is_api(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def api_error(status: int, code: str, detail: str) -> JsonResponse:
    """The API's one error body, for answers given before DRF sees the request."""
    return JsonResponse(error_body(code, detail), status=status)


class RejectNulMiddleware:
    """A NUL (%00) in the path, the query, a header or a console form is a 400 here, for every
    URL: PostgreSQL refuses NUL in text, so a lookup or a write with it would be a 500. (API
    bodies are checked by their parsers, pools/api/parsers.py.)"""

    message = "NUL characters (%00) are not allowed in a request."

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if self.has_nul(request):
            if is_api(request):
                return api_error(400, "invalid", self.message)
            return HttpResponseBadRequest(self.message, content_type="text/plain")
        return self.get_response(request)

    @staticmethod
    def has_nul(request) -> bool:
        texts = [request.path]
        texts += [value for key, value in request.META.items() if key.startswith("HTTP_")]
        forms = [request.GET]
        if request.method == "POST" and not is_api(request):  # API bodies: their parsers
            forms.append(request.POST)  # the console's forms
        for form in forms:
            for key, values in form.lists():
                texts += [key, *values]
        return any(isinstance(text, str) and "\x00" in text for text in texts)


class CommonMiddleware(common.CommonMiddleware):
    """Django's, except under /api/: never the APPEND_SLASH redirect (a client follows a 301 as
    a GET, which turns a submit into a read; API routes match both spellings instead,
    pools/api/routers.py), and a JSON 404 instead of Django's HTML page."""

    def should_redirect_with_slash(self, request):
        return not is_api(request) and super().should_redirect_with_slash(request)

    def process_response(self, request, response):
        response = super().process_response(request, response)
        if (
            is_api(request)
            and response.status_code == 404
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return api_error(404, "not_found", "No API route matches this path.")
        return response


class ConsoleMessageMiddleware(MessageMiddleware):
    """Django's flash messages for the console only: the API never shows one, so its requests
    do not build a message store (the lease API's CPU per grant, docs/benchmarks.md)."""

    def process_request(self, request):
        if not is_api(request):
            super().process_request(request)  # (its process_response skips a request without)
