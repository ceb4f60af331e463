"""Idempotency keys on POST /jobs (as on POST /compute-leases): a retrying client never gets
two jobs, even when its retries race."""

import threading

import pytest
from django.db import connection

from config.builders import TEST_IMAGE_TAG, build_node, build_person, build_pool, build_tenant
from jobs.models import Job
from pools.choices import TenantRole
from tests.clients import client_for

JOBS = "/api/v1/jobs/"


def body(**changes):
    return {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "shape": "cpu-small",
        "image": TEST_IMAGE_TAG,
        "command": ["true"],
    } | changes


def test_a_retry_with_the_same_key_gets_the_same_job(api, member, cpu_shape):
    client = api(member)
    first = client.post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="train-1")
    again = client.post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="train-1")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1
    other = client.post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="train-2")
    assert other.json()["id"] != first.json()["id"]


def test_the_same_key_for_another_job_is_refused(api, member, cpu_shape):
    client = api(member)
    client.post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="k")
    refused = client.post(JOBS, body(name="other"), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert refused.status_code == 422 and refused.json()["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1


@pytest.mark.parametrize("key", ["job-7-attempt-1", "has space", "x" * 101])
def test_a_key_the_scheduler_owns_or_that_is_malformed_is_a_400(api, member, cpu_shape, key):
    response = api(member).post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["errors"]


def test_keys_belong_to_a_tenant(api, member, outsider, cpu_shape):
    mine = api(member).post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="shared")
    theirs = api(outsider).post(
        JOBS, body(tenant="nlp"), format="json", HTTP_IDEMPOTENCY_KEY="shared"
    )
    assert theirs.status_code == 201 and theirs.json()["id"] != mine.json()["id"]


@pytest.mark.django_db(transaction=True)
def test_racing_retries_make_one_job():
    pool = build_pool("race")
    build_node(pool, "n1", cpu=16000, memory=65536)
    tenant = build_tenant("racers")
    person = build_person("racer", tenant=tenant, role=TenantRole.MEMBER)
    barrier = threading.Barrier(4)
    answers = []

    def submit():
        client = client_for(person)
        barrier.wait()
        try:
            resources = {"cpu_millicores_min": 100, "memory_mib_min": 64}
            request = body(tenant="racers", pool="race", shape=None, resources=resources)
            request.pop("shape")
            answers.append(client.post(JOBS, request, format="json", HTTP_IDEMPOTENCY_KEY="once"))
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [201] * 4, [a.content for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert Job.objects.filter(tenant=tenant).count() == 1
