"""Limits on the expensive calls (#13): lease creation per tenant and per token, job submit and
explain per token, all 429 `throttled` with Retry-After; the permits are shared by every server
process through Redis, taken in batches (pools/api/throttles.py SharedPermits)."""

import logging
import uuid

import pytest

from config.builders import TEST_IMAGE_TAG, build_person, build_token, cpu_request
from pools.api import throttles
from tests.clients import bearer_client

LEASES = "/api/v1/compute-leases/"
JOBS = "/api/v1/jobs/"


def reserve(client, pool, tenant):
    body = {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": cpu_request(cpu=10, memory=16),
        "duration_s": 60,
    }
    return client.post(LEASES, body, format="json")


def submit(client, tenant="vision"):
    body = {"tenant": tenant, "pool": "test", "name": "train", "shape": "cpu-small"}
    return client.post(JOBS, body | {"image": TEST_IMAGE_TAG, "command": ["true"]}, format="json")


@pytest.fixture(autouse=True)
def fresh_counters(settings, monkeypatch):
    """Counters of this test only (Redis outlives test databases), and fresh process state."""
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"KEY_PREFIX": f"test-{uuid.uuid4().hex}"}
    }
    monkeypatch.setattr(throttles, "PERMITS", throttles.SharedPermits())
    settings.LEASE_THROTTLE_RATE = ""
    settings.TOKEN_THROTTLE_RATE = ""
    settings.PLACEMENT_THROTTLE_RATE = ""


def assert_throttled(response):
    assert response.status_code == 429, response.content
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) >= 1


def test_lease_creation_per_tenant_429_with_retry_after_others_unaffected(
    api, settings, lpool, lnode, ltenant, ltenant2, lmember, loutsider
):
    settings.LEASE_THROTTLE_RATE = "3/hour"
    # two people of the tenant, two tokens: the tenant's budget is one
    colleague = api(build_person("colleague", tenant=ltenant))
    client = api(lmember)
    statuses = [reserve(c, lpool, ltenant).status_code for c in (client, colleague, client)]
    assert statuses == [201] * 3
    assert_throttled(reserve(colleague, lpool, ltenant))
    assert client.get(LEASES).json()["count"] == 3  # nothing reserved past the limit
    assert reserve(api(loutsider), lpool, ltenant2).status_code == 201  # another tenant


def test_naming_another_tenant_spends_nobodys_lease_budget(
    api, settings, lpool, lnode, ltenant, lmember, loutsider
):
    settings.LEASE_THROTTLE_RATE = "1/hour"
    for _ in range(3):
        assert reserve(api(loutsider), lpool, ltenant).status_code == 400
    assert reserve(api(lmember), lpool, ltenant).status_code == 201


def test_per_token_on_leases_submit_and_explain_a_new_token_has_its_own(
    api, settings, lpool, lnode, ltenant, lmember, cpu_shape, member
):
    settings.TOKEN_THROTTLE_RATE = "2/hour"
    client = api(lmember)
    assert [reserve(client, lpool, ltenant).status_code for _ in range(2)] == [201, 201]
    assert_throttled(reserve(client, lpool, ltenant))
    assert client.get(LEASES).status_code == 200  # reads are not counted
    assert reserve(api(lmember), lpool, ltenant).status_code == 201  # another token
    # submit and explain count against the same token budget
    jobs = api(member)
    job = submit(jobs).json()["id"]
    assert jobs.get(f"{JOBS}{job}/explain/").status_code == 200
    assert_throttled(jobs.get(f"{JOBS}{job}/explain/"))
    assert_throttled(submit(jobs))
    assert jobs.get(f"{JOBS}{job}/").status_code == 200


def test_the_counter_is_shared_by_two_processes_and_never_overshoots(settings):
    """Two processes (two SharedPermits, each with its own local batch) share one Redis counter:
    together they admit exactly the limit, though each took its permits in batches."""
    limit = 1000  # a batch of 10 permits per round trip
    first, second = throttles.SharedPermits(), throttles.SharedPermits()
    admitted = 0
    for i in range(2 * limit):
        admitted += (first if i % 3 else second).wait("lease:shared", limit, 3600) == 0
    assert admitted == limit
    assert first.wait("lease:shared", limit, 3600) > 0 and second.wait("lease:shared", limit, 3600)


def test_a_process_holds_at_most_one_batch_unspent(settings):
    """Under-admission is bounded: a process that took a batch and went quiet leaves the other
    short by less than one batch."""
    limit = 1000
    batch = throttles.SharedPermits.batch_for(limit)
    quiet, busy = throttles.SharedPermits(), throttles.SharedPermits()
    assert quiet.wait("t", limit, 3600) == 0  # takes a batch, spends one permit
    admitted = sum(busy.wait("t", limit, 3600) == 0 for _ in range(limit))
    assert admitted == limit - batch


def test_small_limits_are_exact_batches_of_one():
    assert throttles.SharedPermits.batch_for(60) == 1
    assert throttles.SharedPermits.batch_for(6000) == throttles.SharedPermits.BATCH_MAX


def test_a_refused_flood_does_not_ask_redis_again(settings, monkeypatch):
    permits = throttles.SharedPermits()
    assert permits.wait("flood", 1, 3600) == 0
    calls = []
    monkeypatch.setattr(permits, "_take", lambda *args: calls.append(args) or 0)
    assert permits.wait("flood", 1, 3600) > 0  # learns the counter is spent: one round trip
    assert all(permits.wait("flood", 1, 3600) > 0 for _ in range(50))
    assert len(calls) == 1


def test_without_redis_leases_are_not_throttled_and_a_warning_is_logged(
    api, settings, caplog, lpool, lnode, ltenant, lmember
):
    settings.LEASE_THROTTLE_RATE = "1/hour"
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"LOCATION": "redis://127.0.0.1:1/0"}
    }
    client = api(lmember)
    with caplog.at_level(logging.WARNING):
        assert [reserve(client, lpool, ltenant).status_code for _ in range(3)] == [201] * 3
    assert "throttle off" in caplog.text


def test_a_browser_session_is_counted_per_person(client, settings, lpool, lnode, ltenant, lmember):
    settings.TOKEN_THROTTLE_RATE = "1/hour"
    client.force_login(lmember)
    body = {"pool": lpool.slug, "tenant": ltenant.slug, "resources": cpu_request(10, 16)}
    assert client.post(LEASES, body, content_type="application/json").status_code == 201
    refused = client.post(LEASES, body, content_type="application/json")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    # a token of the same person is counted apart
    assert reserve(bearer_client(build_token(lmember)), lpool, ltenant).status_code == 201
