"""One error body for every 4xx of the API: code, message (detail: the same text), and the field
errors under `errors` — 400, 401, 403, 404, 409, 422 and 429 alike."""

import uuid

import pytest
from rest_framework.test import APIClient

from config.builders import TEST_IMAGE_TAG
from pools.api import throttles

JOBS = "/api/v1/jobs/"


def job(**changes):
    body = {"tenant": "vision", "pool": "test", "name": "train", "shape": "cpu-small"}
    return body | {"image": TEST_IMAGE_TAG, "command": ["true"]} | changes


def assert_one_shape(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    assert body["detail"] == body["message"]
    assert isinstance(body["errors"], dict)
    return body


@pytest.fixture
def member_client(api, member):
    return api(member)


def test_400_names_the_fields(member_client, cpu_shape):
    body = assert_one_shape(member_client.post(JOBS, {}, format="json"), 400, "invalid")
    assert {"image", "tenant"} <= set(body["errors"])
    assert body["errors"]["image"] == body["image"]  # also beside code, as before


def test_401_for_a_bad_token(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer cp_not-a-token")
    assert_one_shape(client.get(JOBS), 401, "not_authenticated")


def test_403_for_a_read_only_token_writing(api, member, cpu_shape):
    body = assert_one_shape(
        api(member, ["read"]).post(JOBS, job(), format="json"), 403, "scope_missing"
    )
    assert "write scope" in body["message"]  # it says which scope is missing (#17)


def test_404_for_another_tenants_job(api, member, outsider, cpu_shape):
    job_id = api(member).post(JOBS, job(), format="json").json()["id"]
    assert_one_shape(api(outsider).get(f"{JOBS}{job_id}/"), 404, "not_found")


def test_409_for_a_transition_not_allowed(member_client, cpu_shape):
    job_id = member_client.post(JOBS, job(), format="json").json()["id"]
    member_client.post(f"{JOBS}{job_id}/cancel/")
    body = assert_one_shape(
        member_client.post(f"{JOBS}{job_id}/cancel/"), 409, "transition_not_allowed"
    )
    assert body["errors"] == {}


def test_422_for_a_shape_that_never_fits_keeps_its_facts(member_client, pool, ready_node):
    body = job(resources={"cpu_millicores_min": 10**6, "memory_mib_min": 64})
    body.pop("shape")
    body = assert_one_shape(member_client.post(JOBS, body, format="json"), 422, "never_fits")
    assert body["reasons"] == {"insufficient_cpu": 1} and body["errors"] == {}


def test_429_with_retry_after(member_client, settings, monkeypatch, cpu_shape):
    prefix = f"test-{uuid.uuid4().hex}"
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"KEY_PREFIX": prefix}
    }
    # this process's permits and outage state fresh
    monkeypatch.setattr(throttles, "PERMITS", throttles.SharedPermits())
    settings.PLACEMENT_THROTTLE_RATE = "1/hour"
    assert member_client.post(JOBS, job(), format="json").status_code == 201
    refused = member_client.post(JOBS, job(), format="json")
    assert_one_shape(refused, 429, "throttled")
    assert int(refused["Retry-After"]) >= 1


def test_nested_field_errors_and_transport_errors_have_the_same_shape(member_client, cpu_shape):
    nested = {"tenant": "vision", "pool": "test", "name": "x", "image": "a@sha256:" + "0" * 64}
    nested["resources"] = {"cpu_millicores_min": 1, "memory_mib_min": 1, "regions": [[1]]}
    body = assert_one_shape(member_client.post(JOBS, nested, format="json"), 400, "invalid")
    assert body["errors"]["resources"] == {"regions": {"0": ["Not a valid string."]}}
    body = assert_one_shape(member_client.get(JOBS + "?state=%00"), 400, "invalid")
    assert "NUL" in body["message"]
