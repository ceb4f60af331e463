"""D2: leases and jobs. Cancelling a job releases its lease; a lease of an ended job is not
renewed; explanations name only the caller's own leases; reported usage is bounded; a job no
node could ever hold is refused at submit; idempotency keys cannot reach the scheduler's own.

Everything goes through the real API (tenant members, node agents) and the services.
"""

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.builders import (
    SYSTEM,
    TEST_IMAGE_TAG,
    build_node,
    build_pool,
    cpu_request,
    gpu_request,
)
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_transition
from leases import services
from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent
from leases.selectors import ledger_problems
from pools.choices import TenantRole
from pools.reasons import Reason
from pools.services import membership_set
from scheduling.passes import scheduling_pass
from tests.clients import client_for

LEASES = "/api/v1/compute-leases"
JOBS = "/api/v1/jobs/"
IMAGE = TEST_IMAGE_TAG  # the real test image, pinned to its digest at submit


# tenant, other_tenant, member (of tenant) and outsider (of other_tenant): tests/conftest.py


@pytest.fixture
def lpool(db):
    """allocatable == raw, and the registry of IMAGE allowed (as every built pool)."""
    return build_pool("d2", exact_capacity=True)


@pytest.fixture
def lnode(lpool):
    return build_node(lpool, "n1", cpu=4000, memory=8192)


def lease_body(pool, tenant, cpu=1000, memory=1024, **extra):
    return {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": memory},
        "duration_s": 300,
        **extra,
    }


def job_body(pool, tenant, cpu=1000, memory=1024):
    return {
        "tenant": tenant.slug,
        "pool": pool.slug,
        "name": "train",
        "image": IMAGE,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": memory},
    }


def reserve(pool, tenant, cpu=1000, memory=1024, duration=timedelta(minutes=5), **extra):
    return services.lease_reserve(
        pool=pool,
        tenant=tenant,
        request=cpu_request(cpu=cpu, memory=memory),
        actor=SYSTEM,
        duration=duration,
        **extra,
    )


def placed_job(client, pool, tenant):
    """A job submitted through the API and placed by a scheduling pass: (job, its lease)."""
    response = client.post(JOBS, job_body(pool, tenant), format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert scheduling_pass().placed == [job.pk]
    return job, Lease.objects.get(job=job)


def names_lease(text: str, lease_id: int) -> bool:
    return re.search(rf"\blease {lease_id}\b|\bleases\b[^(]*\b{lease_id}\b", text) is not None


# --- 1. cancelling a job releases its lease; a lease of an ended job is not renewed ----------


def test_cancelling_a_job_releases_its_lease_at_once(lpool, tenant, lnode, member):
    client = client_for(member)
    job, lease = placed_job(client, lpool, tenant)
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 1000

    response = client.post(f"{JOBS}{job.pk}/cancel/")

    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED and lease.ended_at is not None
    event = lease.events.latest("id")
    assert (event.to_state, event.reason) == (LeaseState.RELEASED, Reason.RELEASED_JOB_ENDED)
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 0 and lnode.memory_mib_reserved == 0
    assert ledger_problems(lpool) == []
    # the node's agent cannot renew it afterwards (the reported 7-day renewal)
    agent = client_for(node=lnode)
    renew = agent.post(
        f"{LEASES}/{lease.pk}/renew",
        {"fencing_token": lease.fencing_token, "duration_s": 7 * 86400},
        format="json",
    )
    assert renew.status_code == 409


@pytest.mark.parametrize("ending", [JobState.FAILED, JobState.LOST])
def test_a_lease_of_an_ended_job_is_not_renewed(lpool, tenant, lnode, member, ending):
    job, lease = placed_job(client_for(member), lpool, tenant)
    agent = client_for(node=lnode)
    token = {"fencing_token": lease.fencing_token}
    assert agent.post(f"{LEASES}/{lease.pk}/commit", token, format="json").status_code == 200
    job_transition(job=job, to=ending, actor=SYSTEM, reason=Reason.NODE_LOST)
    before = Lease.objects.get(pk=lease.pk).expires_at

    response = agent.post(
        f"{LEASES}/{lease.pk}/renew", {**token, "duration_s": 7 * 86400}, format="json"
    )

    assert response.status_code == 409 and response.json()["code"] == "job_ended"
    lease.refresh_from_db()
    assert lease.expires_at == before
    assert not lease.events.filter(reason=Reason.RENEWED).exists()


def test_a_lease_of_a_running_job_is_still_renewed(lpool, tenant, lnode, member):
    _, lease = placed_job(client_for(member), lpool, tenant)
    agent = client_for(node=lnode)
    token = {"fencing_token": lease.fencing_token}
    assert agent.post(f"{LEASES}/{lease.pk}/commit", token, format="json").status_code == 200
    response = agent.post(f"{LEASES}/{lease.pk}/renew", {**token, "duration_s": 600}, format="json")
    assert response.status_code == 200


# --- 2. explanations name only the caller's own leases ---------------------------------------


def test_an_explanation_gives_a_window_but_not_another_tenants_lease(
    lpool, tenant, other_tenant, lnode, member
):
    theirs = reserve(lpool, other_tenant, cpu=4000)  # the other tenant fills the node

    response = client_for(member).post(LEASES, lease_body(lpool, tenant), format="json")

    assert response.status_code == 409
    payload = response.json()
    near = payload["nearest_miss"]
    assert near["fits_on"] == "n1"
    # not when their lease ends (#17): a coarse window
    assert near["fits_at"] is None and near["fits_within"] == "within the hour"
    assert near["after_leases"] == []
    assert "when capacity frees up within the hour" in near["message"]
    assert f"{theirs.expires_at:%H:%M}" not in response.content.decode()
    for text in (payload["message"], near["message"]):
        assert "lease" not in text, text
    # the same for a queued job's pending_reason, as GET shows it
    job_id = client_for(member).post(JOBS, job_body(lpool, tenant), format="json").json()["id"]
    assert scheduling_pass().pending == {job_id: "no_capacity"}
    reason = client_for(member).get(f"{JOBS}{job_id}/").json()["pending_reason"]
    assert reason["nearest_miss"]["after_leases"] == []
    assert reason["nearest_miss"]["fits_at"] is None
    assert reason["nearest_miss"]["fits_within"] == "within the hour"
    assert "lease" not in reason["message"]


def test_an_explanation_still_names_the_callers_own_lease(lpool, tenant, lnode, member):
    client = client_for(member)
    mine = client.post(LEASES, lease_body(lpool, tenant, cpu=4000), format="json").json()

    payload = client.post(LEASES, lease_body(lpool, tenant), format="json").json()

    assert payload["nearest_miss"]["after_leases"] == [str(mine["id"])]
    assert names_lease(payload["message"], mine["id"])


def test_a_mixed_wait_names_only_the_callers_leases(lpool, tenant, other_tenant, lnode, member):
    now = timezone.now()
    theirs = reserve(lpool, other_tenant, cpu=2000, duration=timedelta(minutes=5), now=now)
    mine = reserve(lpool, tenant, cpu=2000, duration=timedelta(minutes=9), now=now)

    payload = (
        client_for(member).post(LEASES, lease_body(lpool, tenant, cpu=4000), format="json").json()
    )

    near = payload["nearest_miss"]
    assert near["after_leases"] == [str(mine.pk)]
    # another tenant's lease must end too: a window, not a time (#17)
    assert near["fits_at"] is None and near["fits_within"] == "within the hour"
    assert names_lease(near["message"], mine.pk)
    assert not names_lease(near["message"], theirs.pk)
    assert not names_lease(payload["message"], theirs.pk)


# --- 3. reported usage is bounded by the lease and the node ----------------------------------


@pytest.fixture
def committed(lpool, tenant, lnode):
    lease = reserve(lpool, tenant, cpu=1000, memory=1024)
    return services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM)


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"cpu_millicores": 999_999_999, "memory_mib": 512}, "cpu_millicores"),
        ({"cpu_millicores": 4001, "memory_mib": 512}, "cpu_millicores"),  # node raw is 4000
        ({"cpu_millicores": 2**31, "memory_mib": 512}, "cpu_millicores"),  # was a 500
        ({"cpu_millicores": 500, "memory_mib": 1025}, "memory_mib"),  # the lease holds 1024
        ({"cpu_millicores": 500, "memory_mib": 2**40}, "memory_mib"),
        ({"cpu_millicores": 500, "memory_mib": 512, "gpu_milli": 1}, "gpu_milli"),  # no GPU
    ],
)
def test_usage_beyond_the_lease_or_node_is_a_400(lnode, committed, usage, field):
    usage = {**usage, "fencing_token": str(committed.fencing_token)}
    response = client_for(node=lnode).post(f"{LEASES}/{committed.pk}/usage", usage, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    committed.refresh_from_db()
    assert committed.usage_reported_at is None and committed.used_cpu_millicores is None


def test_usage_within_bounds_is_recorded_and_cpu_may_burst_to_the_node(lnode, committed):
    usage = {"cpu_millicores": 4000, "memory_mib": 1024, "fencing_token": committed.fencing_token}
    response = client_for(node=lnode).post(f"{LEASES}/{committed.pk}/usage", usage, format="json")
    assert response.status_code == 200
    assert response.json()["consumed"]["cpu_millicores"] == 4000


def test_usage_bounds_hold_in_the_service_for_every_caller(committed):
    with pytest.raises(ValidationError) as caught:
        services.lease_report_usage(
            lease=committed, actor=SYSTEM, cpu_millicores=999_999_999, memory_mib=1
        )
    assert "cpu_millicores" in caught.value.message_dict


def test_gpu_usage_is_bounded_by_the_devices_the_lease_holds(lpool, tenant):
    node = build_node(lpool, "g1", cpu=8000, memory=16384, gpus=[{}, {}])
    request = gpu_request(count=1)
    lease = services.lease_reserve(
        pool=lpool, tenant=tenant, request=request, actor=SYSTEM, duration=timedelta(minutes=5)
    )
    services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM)
    agent = client_for(node=node)
    url = f"{LEASES}/{lease.pk}/usage"
    ok = {"cpu_millicores": 100, "memory_mib": 100, "gpu_milli": 1000}
    ok["fencing_token"] = lease.fencing_token
    assert agent.post(url, ok, format="json").status_code == 200
    response = agent.post(url, {**ok, "gpu_milli": 1001}, format="json")
    assert response.status_code == 400 and "gpu_milli" in response.json()


# --- 4. a job no node could ever hold is refused at submit -----------------------------------


def test_a_job_that_never_fits_is_refused_at_submit_like_a_lease(lpool, tenant, lnode, member):
    client = client_for(member)
    huge = {"cpu_millicores_min": 400_000, "memory_mib_min": 1024}

    response = client.post(JOBS, {**job_body(lpool, tenant), "resources": huge}, format="json")

    assert response.status_code == 422, response.content
    payload = response.json()
    assert payload["code"] == "never_fits" and payload["reasons"] == {"insufficient_cpu": 1}
    assert not Job.objects.exists()
    lease = client.post(LEASES, lease_body(lpool, tenant, cpu=400_000), format="json")
    assert lease.status_code == 422
    assert payload.keys() == lease.json().keys()
    assert payload["reasons"] == lease.json()["reasons"]
    # what fits on an empty node is accepted even when the pool is full now
    reserve(lpool, tenant, cpu=4000)
    assert client.post(JOBS, job_body(lpool, tenant, cpu=4000), format="json").status_code == 201


def test_a_job_for_a_gpu_shape_in_a_cpu_pool_is_refused(lpool, tenant, lnode, member):
    body = {**job_body(lpool, tenant), "resources": gpu_request(count=1)}
    response = client_for(member).post(JOBS, body, format="json")
    assert response.status_code == 422 and response.json()["code"] == "never_fits"


def test_a_pool_without_nodes_yet_still_queues_jobs(lpool, tenant, member):
    """No node at all is "not yet", not "never": capacity may still be enrolled."""
    response = client_for(member).post(JOBS, job_body(lpool, tenant), format="json")
    assert response.status_code == 201 and response.json()["state"] == "queued"


# --- 5. idempotency keys ---------------------------------------------------------------------


def test_a_client_cannot_pre_claim_the_schedulers_key(lpool, tenant, lnode, member):
    """The reported hijack: a member claimed `job-N-attempt-1` with a lease of their own
    choosing, and the scheduler then 'placed' the job on that lease."""
    client = client_for(member)
    job_id = client.post(JOBS, job_body(lpool, tenant), format="json").json()["id"]
    other = lease_body(lpool, tenant, cpu=3000, memory=4096)

    response = client.post(
        LEASES, other, format="json", HTTP_IDEMPOTENCY_KEY=f"job-{job_id}-attempt-1"
    )

    assert response.status_code == 400 and "Idempotency-Key" in response.json()
    assert not Lease.objects.exists()
    assert scheduling_pass().placed == [job_id]
    lease = Lease.objects.get()
    assert lease.job_id == job_id and lease.cpu_millicores == 1000
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.LEASED
    assert job.events.latest("id").data["lease"] == lease.pk


@pytest.mark.parametrize("key", ["x" * 101, "two words", "tab\there", "é-accent"])
def test_malformed_idempotency_keys_are_a_400(lpool, tenant, lnode, member, key):
    response = client_for(member).post(
        LEASES, lease_body(lpool, tenant), format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code == 400 and "Idempotency-Key" in response.json()
    assert not Lease.objects.exists()


def test_a_key_reused_with_another_body_is_a_422(lpool, tenant, lnode, member):
    client = client_for(member)
    key = {"HTTP_IDEMPOTENCY_KEY": "4f1c2a8e-0d7b-4c1e-9a53-7f3e2b1d9c60"}
    first = client.post(LEASES, lease_body(lpool, tenant), format="json", **key)
    assert first.status_code == 201
    again = client.post(LEASES, lease_body(lpool, tenant), format="json", **key)
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]

    for change in (
        {"resources": {"cpu_millicores_min": 2000, "memory_mib_min": 1024}},
        {"duration_s": 600},
    ):
        response = client.post(
            LEASES, {**lease_body(lpool, tenant), **change}, format="json", **key
        )
        assert response.status_code == 422, (change, response.content)
        assert response.json()["code"] == "idempotency_key_reused"
    assert Lease.objects.count() == 1
    assert LeaseEvent.objects.filter(reason=Reason.RESERVED).count() == 1


def test_the_same_key_in_another_tenant_is_another_lease(
    lpool, tenant, other_tenant, lnode, member, outsider
):
    key = {"HTTP_IDEMPOTENCY_KEY": "retry-1"}
    mine = client_for(member).post(LEASES, lease_body(lpool, tenant), format="json", **key)
    theirs = client_for(outsider).post(
        LEASES, lease_body(lpool, other_tenant), format="json", **key
    )
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]


def test_a_member_of_two_tenants_keeps_keys_apart(lpool, tenant, other_tenant, lnode, member):
    membership_set(user=member, tenant=other_tenant, role=TenantRole.MEMBER, actor=SYSTEM)
    client, key = client_for(member), {"HTTP_IDEMPOTENCY_KEY": "same"}
    one = client.post(LEASES, lease_body(lpool, tenant), format="json", **key)
    two = client.post(LEASES, lease_body(lpool, other_tenant), format="json", **key)
    assert one.status_code == two.status_code == 201
    assert one.json()["tenant"] == "vision" and two.json()["tenant"] == "nlp"
