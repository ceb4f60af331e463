"""The HTTP client of the public API, and what its answers mean to a shell: a 4xx is the API
refusing the request (ApiRefused, exit 2), a 5xx or no answer at all is the server's or the
network's trouble (ServerError, exit 3)."""

from __future__ import annotations

import requests

from poolctl import __version__
from poolctl.config import Config

PAGE_SIZE = 1000  # the most items a page of the API holds (pools/api/pagination.py, events)
# config/middleware.py: the JSON 404 of a path no API route matches (an older server, a typo)
NO_ROUTE = "No API route matches this path."


class ApiRefused(Exception):
    """The API answered 4xx: `code` (its reason code), a message and the field errors."""

    exit_code = 2

    def __init__(self, status: int, code: str, message: str, fields: dict[str, list[str]]):
        super().__init__(message)
        self.status, self.code, self.message, self.fields = status, code, message, fields

    def __str__(self) -> str:
        lines = [f"refused ({self.status} {self.code}): {self.message}".rstrip(": ")]
        lines += [f"  {field}: {' '.join(messages)}" for field, messages in self.fields.items()]
        return "\n".join(lines)


class ServerError(Exception):
    """A 5xx, an answer that is not the API's, or no answer: exit 3."""

    exit_code = 3


def _texts(value) -> list[str]:
    """Field errors as DRF writes them: a string, a list of strings, or nested objects."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    if isinstance(value, dict):
        return [f"{key}: {text}" for key, item in value.items() for text in _texts(item)]
    return [str(value)]


def _is_field_error(value) -> bool:
    """DRF's field errors are lists of messages, or objects of them (a nested serializer); an
    explanation beside a refusal (`reasons`, `nearest_miss`) is neither: its message says it."""
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and bool(value) and all(map(_is_field_error, value.values()))


def refusal(response: requests.Response) -> ApiRefused:
    """The error body `{"code", "detail", <field>: [...]}`, read defensively: a `message` is
    preferred to `detail`, an `errors` object or list adds field errors, and a body that is not
    JSON still gives a readable message."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):  # a proxy's page, or a URL that is not the API's root
        message = (
            f"{response.reason or 'refused'}, and not in the API's words: is POOLCTL_URL right?"
        )
        return ApiRefused(response.status_code, f"http_{response.status_code}", message, {})
    code = str(body.get("code") or "http_error")
    message = body.get("message") or body.get("detail") or ""
    message = message if isinstance(message, str) else " ".join(_texts(message))
    fields: dict[str, list[str]] = {}
    errors = body.get("errors")
    if isinstance(errors, dict):
        fields.update({key: _texts(value) for key, value in errors.items()})
    elif isinstance(errors, list):
        for item in errors:
            if isinstance(item, dict) and ("field" in item or "message" in item):
                field = str(item.get("field") or "error")
                fields.setdefault(field, []).append(str(item.get("message") or item))
            else:
                fields.setdefault("error", []).extend(_texts(item))
    for key, value in body.items():
        if key not in ("code", "detail", "message", "errors") and _is_field_error(value):
            fields.setdefault(key, _texts(value))
    if response.status_code == 404 and message == NO_ROUTE:
        path = response.request.path_url.split("?")[0] if response.request else ""
        message = f"this server has no API route {path} (is it an older version?)"
    elif response.status_code == 401:
        message += " Check POOLCTL_TOKEN or the token in the config file."
    retry = response.headers.get("Retry-After")
    if response.status_code == 429 and retry:
        message += f" Retry after {retry} s."
    return ApiRefused(response.status_code, code, message, fields)


class Client:
    def __init__(self, config: Config):
        self.config = config
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {config.token}"
        self.session.headers["User-Agent"] = f"poolctl/{__version__}"
        self.session.headers["Accept"] = "application/json"

    def url(self, path: str) -> str:
        return f"{self.config.api}/{path.lstrip('/')}"

    def request(self, method: str, path: str, *, stream: bool = False, **kwargs):
        """The response of a 2xx; ApiRefused or ServerError otherwise."""
        url = path if path.startswith(("http://", "https://")) else self.url(path)
        try:
            response = self.session.request(
                method, url, timeout=self.config.timeout, stream=stream, **kwargs
            )
        except requests.Timeout:
            raise ServerError(
                f"{self.config.url} did not answer within {self.config.timeout:g} s"
            ) from None
        except requests.RequestException as exc:
            raise ServerError(f"cannot reach {self.config.url}: {_reason(exc)}") from None
        if response.status_code >= 500:
            raise ServerError(f"the server failed ({response.status_code}) on {method} {url}")
        if response.status_code >= 400:
            raise refusal(response)
        return response

    def json(self, method: str, path: str, **kwargs):
        return _decode(self.request(method, path, **kwargs))

    def get(self, path: str, **params):
        return self.json("GET", path, params=_present(params))

    def post(self, path: str, body: dict | None = None, headers: dict | None = None):
        return self.json("POST", path, json=body if body is not None else {}, headers=headers)

    def delete(self, path: str):
        return self.json("DELETE", path)

    def list(self, path: str, limit: int = 0, **params) -> list:
        """Every item of a list endpoint, following its pages (`limit` > 0: at most that many):
        limit/offset pages (`{"count", "next", "results"}`) and cursor pages (a plain list with
        `Link: <…>; rel="next"`, as the job events) alike."""
        params["limit"] = min(limit or PAGE_SIZE, PAGE_SIZE)
        response = self.request("GET", path, params=_present(params))
        page = _decode(response)
        paged = isinstance(page, dict) and "results" in page
        items = list(page["results"] if paged else page if isinstance(page, list) else [page])
        while not limit or len(items) < limit:
            following = page.get("next") if paged else response.links.get("next", {}).get("url")
            if not following:
                break
            response = self.request("GET", following)
            page = _decode(response)
            items += page["results"] if paged else page
        return items[:limit] if limit else items


def _present(params: dict) -> dict:
    return {key: value for key, value in params.items() if value not in (None, "")}


def _decode(response: requests.Response):
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        raise ServerError(
            f"{response.request.method} {response.url} answered something that is not JSON "
            "(is POOLCTL_URL the Compute Pool server?)"
        ) from None


def _reason(exc: requests.RequestException) -> str:
    """The innermost cause ("Connection refused"), not urllib3's paragraph."""
    cause = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    text = str(cause.args[-1] if cause.args else cause)
    return text.split("] ")[-1] if "] " in text else text
