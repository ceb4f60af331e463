"""Issue 12: no tenant can fill the control plane. A tenant's queued jobs are capped per pool
(429 queue_full), and placement searches are rate-limited per tenant (429 throttled)."""

import logging
import uuid

import pytest

from config.builders import TEST_IMAGE_TAG, cpu_request
from pools.api import throttles
from pools.models import Quota

JOBS = "/api/v1/jobs/"
LEASES = "/api/v1/compute-leases"


def submit(client, tenant="vision", name="train"):
    body = {
        "tenant": tenant,
        "pool": "test",
        "name": name,
        "shape": "cpu-small",
        "image": TEST_IMAGE_TAG,
        "command": ["echo", "hi"],
    }
    return client.post(JOBS, body, format="json")


def reserve(client, pool, tenant):
    body = {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": cpu_request(cpu=100, memory=64),
        "duration_s": 60,
    }
    return client.post(LEASES, body, format="json")


@pytest.fixture(autouse=True)
def fresh_counters(settings, monkeypatch):
    """Counters of this test only (Redis outlives test databases); no outage left over."""
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"KEY_PREFIX": f"test-{uuid.uuid4().hex}"}
    }
    # this process's permits and outage state fresh
    monkeypatch.setattr(throttles, "PERMITS", throttles.SharedPermits())


# --- queued jobs are capped per tenant and pool ---------------------------------------------


def test_the_cap_refuses_a_submit_with_queue_full_until_a_job_is_cancelled(
    api, settings, member, outsider, cpu_shape
):
    settings.TENANT_MAX_QUEUED_JOBS = 2  # the tenant has no Quota row
    client = api(member)
    first = submit(client).json()["id"]
    assert submit(client).status_code == 201
    refused = submit(client)
    assert refused.status_code == 429
    body = refused.json()
    assert body["code"] == "queue_full" and body["max_queued_jobs"] == 2
    assert client.get(JOBS).json()["count"] == 2  # nothing was stored
    # Another tenant in the same pool is not held back by this one's queue.
    assert submit(api(outsider), tenant="nlp").status_code == 201
    # A cancelled job leaves the queue, and its slot is free again.
    assert client.post(f"{JOBS}{first}/cancel/").status_code == 200
    assert submit(client).status_code == 201
    assert submit(client).status_code == 429


def test_the_tenants_quota_row_sets_its_cap(api, settings, member, tenant, pool, cpu_shape):
    settings.TENANT_MAX_QUEUED_JOBS = 100
    Quota.objects.create(
        tenant=tenant, pool=pool, cpu_millicores=10**6, memory_mib=10**6, max_queued_jobs=1
    )
    client = api(member)
    assert submit(client).status_code == 201
    assert submit(client).json()["code"] == "queue_full"


# --- placement searches are rate-limited per tenant -------------------------------------------


def test_naming_another_tenant_does_not_spend_its_budget(
    api, settings, member, outsider, cpu_shape
):
    settings.PLACEMENT_THROTTLE_RATE = "2/hour"
    for _ in range(5):  # a stranger naming the tenant is a 400, counted against nobody
        assert submit(api(outsider), tenant="vision").status_code == 400
    assert submit(api(member)).status_code == 201


def test_submits_past_the_rate_get_429_with_retry_after_other_tenants_do_not(
    api, settings, member, outsider, cpu_shape
):
    settings.PLACEMENT_THROTTLE_RATE = "2/hour"
    client = api(member)
    assert [submit(client).status_code for _ in range(2)] == [201, 201]
    refused = submit(client)
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"
    assert refused.has_header("Retry-After")
    assert client.get(JOBS).json()["count"] == 2
    assert submit(api(outsider), tenant="nlp").status_code == 201


def test_without_redis_placement_is_not_throttled_and_a_warning_is_logged(
    api, settings, caplog, member, cpu_shape
):
    settings.PLACEMENT_THROTTLE_RATE = "1/hour"
    settings.CACHES = settings.CACHES | {
        "throttle": settings.CACHES["throttle"] | {"LOCATION": "redis://127.0.0.1:1/0"}
    }
    client = api(member)
    with caplog.at_level(logging.WARNING):
        assert [submit(client, name=f"j{i}").status_code for i in range(3)] == [201] * 3
    assert "throttle off" in caplog.text
