"""Issue 9, transport level: whatever arrives at /api/ gets a 4xx JSON error, never a 500 or an
HTML page, and a missing trailing slash never turns a submit into a read."""

import json
import re

import pytest
from django.conf import settings
from django.db import DataError
from django.test import Client
from django.urls import URLPattern, URLResolver, resolve, reverse
from rest_framework.test import APIClient

from config.builders import TEST_IMAGE_TAG, build_node
from jobs.models import Job
from pools.api.errors import exception_handler
from pools.choices import TokenScope
from pools.services import api_token_issue
from tests.clients import client_for

IMAGE = TEST_IMAGE_TAG  # the real test image, pinned to its digest at submit


def job_body(**overrides):
    return {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "shape": "cpu-small",
        "image": IMAGE,
        "command": ["echo", "hi"],
    } | overrides


def client(user, scopes=(TokenScope.READ, TokenScope.WRITE)):
    """A token client that answers a server error with its 500 instead of raising it."""
    api = client_for(user, scopes)
    api.raise_request_exception = False
    return api


def assert_json_error(response, status, code=None):
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["detail"], body
    if code:
        assert body["code"] == code, body
    return body


# 1. NUL characters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        job_body(shape=None, resources={"cpu_millicores_min": 500, "gpu_models": ["A\u0000"]}),
        job_body(env={"PATH": "/bin\u0000"}),
        job_body(**{"nam\u0000e": "x"}),  # in a key, too
        job_body(command=["echo", {"deep": ["\u0000"]}]),
        job_body(command=["echo", {"lone surrogate": "\ud800"}]),
    ],
    ids=["gpu_models", "env", "key", "nested", "surrogate"],
)
def test_nul_anywhere_in_a_json_body_is_a_400(member, cpu_shape, body):
    raw = json.dumps(body)  # ASCII, with \u escapes, as most clients send it
    response = client(member).post("/api/v1/jobs/", raw, content_type="application/json")
    body = assert_json_error(response, 400, "parse_error")
    assert "NUL" in body["detail"]
    assert not Job.objects.exists()


def test_nul_in_an_api_form_body_is_a_400(member, cpu_shape):
    response = client(member).post("/api/v1/jobs/", job_body(name="a\x00"), format="multipart")
    assert_json_error(response, 400, "parse_error")


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/tenants/%00/",
        "/api/v1/pools/%00/",
        "/api/v1/pools/%00/capacity",
        "/api/v1/compute-leases/accounting?tenant=%00",
        "/api/v1/compute-leases/accounting?pool=%00",
        "/api/v1/jobs/?tenant__slug=%00",
        "/api/v1/shapes/?pool__slug=a%00b",
        "/api/v1/jobs/?x%00=1",
    ],
)
def test_nul_in_an_api_path_or_query_is_a_400(operator, tenant, pool, url):
    response = client(operator, [*TokenScope.values]).get(url)
    body = assert_json_error(response, 400, "invalid")
    assert "NUL" in body["detail"]


def test_nul_in_a_console_form_or_query_is_not_a_500(member):
    browser = Client(raise_request_exception=False)
    login = browser.post("/accounts/login/", {"username": "mem\x00ber", "password": "pw-\x00"})
    assert login.status_code in (200, 400)
    assert browser.get("/accounts/login/?next=%00").status_code == 400
    assert browser.post("/accounts/login/?next=/%00", {"username": "member"}).status_code == 400


# 2. nesting depth ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 3_000, 100_000])
def test_deeply_nested_json_is_a_400(member, cpu_shape, depth):
    nested = "[" * depth + "]" * depth
    raw = '{"tenant": "vision", "pool": "test", "name": "n", "command": ' + nested + "}"
    response = client(member).post("/api/v1/jobs/", raw, content_type="application/json")
    body = assert_json_error(response, 400, "parse_error")
    assert "deep" in body["detail"]


def test_nesting_within_the_limit_reaches_the_serializer(member, cpu_shape):
    nested = {"a": 1}
    for _ in range(61):  # 64 levels in all: the body, command's list, 62 maps
        nested = {"a": nested}
    response = client(member).post("/api/v1/jobs/", job_body(command=["x", nested]), format="json")
    assert response.status_code == 400
    assert "command" in response.json()  # the serializer's field error, not the parser's


# 3. pagination bounds --------------------------------------------------------------------------

LISTS = [
    "tenants",
    "pools",
    "shapes",
    "tokens",
    "jobs",
    "nodes",
    "enrollment-tokens",
    "compute-leases",
]


@pytest.mark.parametrize("name", LISTS)
@pytest.mark.parametrize(
    "query",
    [
        "limit=15937851620751980980338688",
        "offset=1000000000000000000000000000000",
        "limit=15937851620751980980338688&offset=1000000000000000000000000000000",
        "limit=-5&offset=-7",
        "limit=abc&offset=1e9",
        "limit=" + "9" * 5000,
    ],
)
def test_huge_or_invalid_limit_and_offset_never_500(
    operator, member, cpu_shape, ready_node, name, query
):
    client(member).post("/api/v1/jobs/", job_body(), format="json")  # a row on every list
    response = client(operator, [*TokenScope.values]).get(f"/api/v1/{name}/?{query}")
    assert response.status_code == 200, (response.status_code, response.content[:300])
    assert isinstance(response.json()["results"], list)


def test_limit_is_capped_at_a_thousand(member):
    for i in range(1001):
        api_token_issue(user=member, name=f"t{i}")
    response = client(member).get("/api/v1/tokens/?limit=15937851620751980980338688")
    assert response.status_code == 200
    page = response.json()
    assert page["count"] == 1002 and len(page["results"]) == 1000
    assert "limit=1000" in page["next"] and "offset=1000" in page["next"]


# 4. body size ----------------------------------------------------------------------------------


def test_a_json_body_over_the_size_limit_is_a_json_413(member, cpu_shape):
    big = job_body(name="x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1))
    response = client(member).post("/api/v1/jobs/", big, format="json")
    assert_json_error(response, 413, "request_too_large")


def test_a_form_body_over_the_size_limit_is_a_json_413(member, cpu_shape):
    big = {"name": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    response = client(member).post("/api/v1/jobs/", big, format="multipart")
    assert_json_error(response, 413, "request_too_large")


# 5. trailing slash -----------------------------------------------------------------------------


def test_post_without_the_trailing_slash_submits(member, cpu_shape):
    api = client(member)
    response = api.post("/api/v1/jobs", job_body(), format="json")
    assert response.status_code == 201, response.content[:300]
    assert Job.objects.count() == 1
    for url in ("/api/v1/jobs", "/api/v1/jobs/"):
        listed = api.get(url)
        assert listed.status_code == 200 and listed.json()["count"] == 1
    job = response.json()["id"]
    assert api.post(f"/api/v1/jobs/{job}/cancel").status_code == 200


def _api_routes(patterns, prefix=""):
    """(name, regex) of every named route under /api/v1/, without the .json format variants."""
    for entry in patterns:
        regex = prefix + entry.pattern.regex.pattern.lstrip("^")
        if isinstance(entry, URLResolver):
            yield from _api_routes(entry.url_patterns, re.sub(r"\$$", "", regex))
        elif isinstance(entry, URLPattern) and entry.name and "format" not in regex:
            yield entry.name, regex


SAMPLE = {
    "pk": "1",
    "slug": "test",
    "probe_id": "1",
    "job_id": "1",
    "name": "out",
    "grant_id": "1",
    "username": "someone",
}


def test_every_api_route_answers_with_and_without_the_slash_and_never_redirects(operator, pool):
    from config import api_urls

    api = client(operator, [*TokenScope.values])
    routes = list(_api_routes(api_urls.urlpatterns))
    assert len(routes) > 30  # the whole API, not a handful
    for name, regex in routes:
        kwargs = {key: SAMPLE[key] for key in re.compile(regex).groupindex}
        path = reverse(name, kwargs=kwargs).rstrip("/")
        # the API root is /api/v1/ itself (config/urls.py); every route below it has both
        for url in (path, path + "/") if name != "api-root" else (path + "/",):
            assert resolve(url).url_name == name, url
            for method in (api.get, api.post):
                response = method(url)
                assert response.status_code not in (301, 302, 308, 404, 500) or (
                    response.status_code == 404 and kwargs
                ), (url, response.status_code)


def test_unknown_api_paths_are_a_json_404_not_a_redirect(member):
    api = client(member)
    for url in ("/api/v1/nope", "/api/v1/nope/", "/api/v2/jobs"):
        for method in (api.get, api.post):
            assert_json_error(method(url), 404, "not_found")


# 6. one error shape ----------------------------------------------------------------------------


def test_every_error_has_a_code_and_a_detail(member, cpu_shape):
    anonymous = APIClient()
    assert_json_error(anonymous.get("/api/v1/jobs/"), 401, "not_authenticated")
    api = client(member)
    assert_json_error(api.get("/api/v1/jobs/999999/"), 404, "not_found")
    assert_json_error(api.put("/api/v1/jobs/", {}, format="json"), 405, "method_not_allowed")
    assert_json_error(
        api.post("/api/v1/jobs/", "{not json", content_type="application/json"), 400, "parse_error"
    )
    fields = assert_json_error(api.post("/api/v1/jobs/", {}, format="json"), 400, "invalid")
    assert "image" in fields  # the field errors stay beside code and detail
    read_only = client(member, [TokenScope.READ])
    assert_json_error(read_only.post("/api/v1/jobs/", job_body(), format="json"), 403)
    # the scheduler's refusals share the shape, with the explanation beside code and detail
    lease = {"pool": "test", "tenant": "vision", "shape": "cpu-small"}
    no_nodes = assert_json_error(api.post("/api/v1/compute-leases", lease, format="json"), 409)
    assert no_nodes["code"] == "no_capacity" and "reasons" in no_nodes
    build_node(cpu_shape.pool, "tiny", cpu=100, memory=64)  # far smaller than cpu-small
    never = assert_json_error(api.post("/api/v1/jobs", job_body(), format="json"), 422)
    assert never["code"] == "never_fits" and never["detail"] == never["message"]


def test_a_database_data_error_is_a_400_not_a_500():
    # the last line of defence: a value the serializers let through and PostgreSQL refuses
    response = exception_handler(DataError("integer out of range"), {})
    assert response.status_code == 400
    assert response.data["code"] == "invalid" and response.data["detail"]
