"""A job named into a reservation (`reservation` on POST /jobs) runs on that lease once its window
opens, and waits for it before; the submit refuses what could not run in it. Through the API and
the real pass, on PostgreSQL, the ledger checked after each step."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, cpu_request, submit_job
from jobs.choices import JobState
from jobs.models import Job
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import Window, lease_reserve, release_unclaimed_reservations
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from tests.clients import client_for

HOUR = timedelta(hours=1)


def reservation(client, pool, start, cpu=2000, hours=1, tolerance_s=300, scratch=2048):
    window = {
        "start": start.isoformat(),
        "end": (start + hours * HOUR).isoformat(),
        "tolerance_s": tolerance_s,
    }
    body = {
        "pool": pool.slug,
        "tenant": pool.tenant_slug,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": 1024, "scratch_mib": scratch},
        "window": window,
    }
    response = client.post("/api/v1/compute-leases", body, format="json")
    assert response.status_code == 201, response.json()
    return Lease.objects.get(pk=response.json()["id"])


def reserve(pool, tenant, request, window):
    return lease_reserve(
        pool=pool, tenant=tenant, request=request, actor=SYSTEM, duration=1, window=window
    )


def submit(client, pool, **fields):
    body = {
        "tenant": pool.tenant_slug,
        "pool": pool.slug,
        "name": "in-reservation",
        "image": TEST_IMAGE_TAG,
        "resources": {"cpu_millicores_min": 1000, "memory_mib_min": 512},
        "max_runtime_s": 600,
    }
    return client.post("/api/v1/jobs/", body | fields, format="json")


@pytest.fixture(autouse=True)
def tenant_slug(pool, tenant):
    pool.tenant_slug = tenant.slug  # the scheduling tests' tenant (tests/nodes/conftest.py)


@pytest.fixture
def two_nodes(pool):
    return build_node(pool, "a", cpu=4000, memory=8192), build_node(
        pool, "b", cpu=4000, memory=8192
    )


def test_a_job_waits_for_its_reservation_and_runs_on_it_when_the_window_opens(
    api, member, pool, two_nodes
):
    client = api(member)
    start = timezone.now() + timedelta(seconds=3)  # the agent reports at the real time
    held = reservation(client, pool, start)
    response = submit(client, pool, reservation=held.pk)
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    assert response.json()["reservation"] == held.pk

    # before the window: it waits, naming its reservation, and takes no other capacity
    result = scheduling_pass()
    assert job_id not in result.placed
    job = Job.objects.get(pk=job_id)
    assert job.pending_reason["code"] == Reason.RESERVATION_WINDOW_NOT_OPEN
    assert job.pending_reason["reservation"] == held.pk
    assert not job.leases.exists()

    # the window opens: the reservation becomes its lease, on the reservation's node
    time.sleep(max(0.0, (start - timezone.now()).total_seconds()) + 0.1)
    assert scheduling_pass().placed == [job_id]
    held.refresh_from_db()
    job.refresh_from_db()
    assert job.state == JobState.LEASED and held.job_id == job_id
    assert list(job.leases.all()) == [held] and held.state == LeaseState.RESERVED
    assert ledger_problems(pool) == []
    # what the agent sees: the job is an assignment of the reservation's node; its start
    # commits the reservation, which is the claim
    node_api = client_for(node=held.node)
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert (entry["job"], entry["lease"]) == (job_id, held.pk)
    for step in ("pulling", "starting"):
        body = {"step": step, "fencing_token": str(held.fencing_token)}
        answer = node_api.post(f"/api/v1/agent/jobs/{job_id}/report", body, format="json")
        assert answer.status_code == 200, answer.json()
    held.refresh_from_db()
    assert held.state == LeaseState.COMMITTED and held.expires_at == held.window_end
    assert release_unclaimed_reservations(now=start + HOUR / 2) == 0  # claimed: not released
    assert ledger_problems(pool) == []


@pytest.mark.parametrize(
    ("change", "fields", "says"),
    [
        ("other tenant's", {}, "No reservation"),
        ("past its window", {}, "takes no job"),
        ("too small", {"resources": {"cpu_millicores_min": 3000, "memory_mib_min": 512}}, "fit"),
        ("too long", {"max_runtime_s": 2 * 3600}, "max_runtime_s"),
        ("a gang", {"gang": {"name": "g", "size": 2}}, "gang"),
        ("not a reservation", {}, "No reservation"),
    ],
)
def test_a_job_that_cannot_run_in_the_reservation_is_a_400_on_the_field(
    api, member, pool, other_tenant, two_nodes, change, fields, says
):
    client = api(member)
    held = reservation(client, pool, timezone.now() + HOUR)
    lease_id = held.pk
    if change == "other tenant's":  # reads as one that does not exist
        window = Window(held.window_start, held.window_end)
        lease_id = reserve(pool, other_tenant, cpu_request(500, 256), window=window).pk
    if change == "not a reservation":
        lease_id = client.post(
            "/api/v1/compute-leases",
            {
                "pool": pool.slug,
                "tenant": pool.tenant_slug,
                "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
                "duration_s": 300,
            },
            format="json",
        ).json()["id"]
    if change == "past its window":
        release_unclaimed_reservations(now=held.expires_at)
    response = submit(client, pool, reservation=lease_id, **fields)
    assert response.status_code == 400, response.json()
    assert says in str(response.json()["errors"]["reservation"]), response.json()
    assert not Job.objects.exists()


def test_one_live_job_per_reservation(api, member, pool, two_nodes):
    client = api(member)
    held = reservation(client, pool, timezone.now() + HOUR)
    assert submit(client, pool, reservation=held.pk).status_code == 201
    second = submit(client, pool, reservation=held.pk)
    assert second.status_code == 400 and "already named" in str(second.json())


def test_a_job_whose_reservation_ended_unclaimed_is_placed_like_any_other(
    api, member, pool, two_nodes
):
    client = api(member)
    start = timezone.now() + HOUR
    held = reservation(client, pool, start, tolerance_s=60)
    job_id = submit(client, pool, reservation=held.pk).json()["id"]
    assert release_unclaimed_reservations(now=start + timedelta(minutes=2)) == 1
    now = start + timedelta(minutes=3)
    assert scheduling_pass(now=now).placed == [job_id]
    lease = Lease.objects.get(job_id=job_id)
    assert lease.pk != held.pk and lease.window_start is None
    assert ledger_problems(pool) == []


def test_a_non_checkpointable_job_backfills_only_when_its_runtime_ends_before_the_reclaim(
    pool, tenant, member, api
):
    node = build_node(pool, "only", cpu=4000, memory=8192)
    client = api(member)
    start = timezone.now() + HOUR
    # all its CPU, in an hour; disk for three jobs' outputs
    reservation(client, pool, start, cpu=node.cpu_millicores_allocatable, scratch=8192)
    long_job = submit_job(pool, tenant, cpu=1000, memory=512, max_runtime_s=2 * 3600)
    short_job = submit_job(pool, tenant, cpu=1000, memory=512, max_runtime_s=1800)
    result = scheduling_pass()
    assert result.placed == [short_job.pk], Job.objects.get(pk=short_job.pk).pending_reason
    assert Lease.objects.get(job=short_job).backfill_of is not None
    waiting = Job.objects.get(pk=long_job.pk)
    assert waiting.state == JobState.QUEUED
    # it is told how it would run now, and the advice works
    advice = waiting.pending_reason["advice"]
    assert advice.startswith("a reservation's capacity is free until its window opens: declare a")
    assert "or make it checkpointable" in advice
    bound = int(advice.split("under ")[1].split(" s")[0])
    assert 3500 < bound < 3600  # the window in an hour, less the reclaim lead
    heeded = submit_job(pool, tenant, cpu=1000, memory=256, max_runtime_s=bound - 1)
    checkpointable = submit_job(pool, tenant, cpu=10, memory=64, checkpointable=True)
    placed = scheduling_pass().placed
    assert sorted(placed) == sorted([heeded.pk, checkpointable.pk]), Job.objects.get(
        pk=checkpointable.pk
    ).pending_reason
    assert ledger_problems(pool) == []
