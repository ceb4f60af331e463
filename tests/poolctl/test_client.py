"""The HTTP client: the API's error bodies read defensively, a path with no route named as such,
and lists followed across their pages (limit/offset pages and the events' cursor pages)."""

import json

import pytest
import requests

from config.builders import submit_job
from jobs.services import job_cancel
from poolctl import client as client_module
from poolctl.client import ApiRefused, Client, refusal
from poolctl.config import load
from pools.actors import Actor


def answer(status: int, body, reason: str = "") -> requests.Response:
    """An HTTP answer as requests hands it over (the body as bytes)."""
    response = requests.Response()
    response.status_code, response.reason = status, reason
    response._content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response.request = requests.Request("GET", "http://h/api/v1/jobs/1?x=1").prepare()
    return response


def test_todays_body_code_detail_and_field_errors():
    error = refusal(answer(400, {"code": "invalid", "detail": "Invalid input.", "tenant": ["No."]}))
    assert (error.status, error.code, error.message) == (400, "invalid", "Invalid input.")
    assert error.fields == {"tenant": ["No."]}
    assert str(error) == "refused (400 invalid): Invalid input.\n  tenant: No."


def test_a_message_is_preferred_and_errors_add_fields():
    body = {
        "code": "quota_exceeded",
        "detail": "old words",
        "message": "GPU-hours used up",
        "errors": [{"field": "resources", "message": "too many GPUs"}, "and this"],
        "dimension": "gpu_hours",  # an explanation beside them is not a field error
        "reasons": {"insufficient_gpu": 2},
        "nearest_miss": {"node": "n1", "lacking": {"gpu_count": 1}},
    }
    error = refusal(answer(409, body))
    assert (error.code, error.message) == ("quota_exceeded", "GPU-hours used up")
    assert error.fields == {"resources": ["too many GPUs"], "error": ["and this"]}
    nested = refusal(answer(400, {"errors": {"resources": {"gpu_milli": ["1..999"]}}}))
    assert nested.code == "http_error" and nested.fields == {"resources": ["gpu_milli: 1..999"]}


def test_a_body_that_is_not_json_and_a_throttle():
    error = refusal(answer(413, b"<html>Too large</html>", reason="Payload Too Large"))
    assert error.code == "http_413" and error.message.startswith("Payload Too Large, and not")
    throttled = answer(429, {"code": "throttled", "detail": "Slow down."})
    throttled.headers["Retry-After"] = "7"
    assert refusal(throttled).message == "Slow down. Retry after 7 s."


@pytest.fixture
def api_client(poolctl_env) -> Client:
    return Client(load(poolctl_env))


def test_a_path_without_a_route_is_named(api_client):
    with pytest.raises(ApiRefused) as caught:
        api_client.get("no-such-thing")
    assert caught.value.code == "not_found"
    assert caught.value.message == (
        "this server has no API route /api/v1/no-such-thing (is it an older version?)"
    )


def test_lists_are_followed_across_their_pages(api_client, pool, tenant, monkeypatch):
    jobs = [submit_job(pool, tenant, name=f"j{n}") for n in range(3)]
    job_cancel(job=jobs[0], actor=Actor.system("test"))
    monkeypatch.setattr(client_module, "PAGE_SIZE", 1)  # one item a page: every page followed
    assert [job["name"] for job in api_client.list("jobs")] == ["j2", "j1", "j0"]
    assert [job["name"] for job in api_client.list("jobs", limit=2)] == ["j2", "j1"]
    events = api_client.list(f"jobs/{jobs[0].pk}/events")  # the cursor's Link: rel="next"
    assert [event["reason"] for event in events] == ["submitted", "cancelled_by_user"]
