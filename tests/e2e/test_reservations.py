"""Reservations, backfill and a head of line that waits for nodes never ready, end to end
(tests/e2e/conftest.py): the tenants speak HTTP to the live server, the real agent runs the
jobs in containers on the real Docker engine, and the test drives the periodic work itself
(the scheduling pass, the backfill reclaim, the lease expiry) with the real `now`, since the
agent reports at the real time. Windows are seconds ahead, so each test waits them out for
real. Each test leaves its jobs ended and its reservations released (the next one finds the
node empty)."""

from __future__ import annotations

import io
import tarfile
import time
from datetime import datetime, timedelta

import pytest
import requests
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from config.builders import build_node, build_person, build_tenant, build_token
from jobs.models import Job
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import expire_leases, release_unclaimed_reservations
from leases.services.backfill import reclaim_lead
from nodes import services as node_services
from pools.models import PriorityClass, Quota
from scheduling.backfill import reclaim_backfills
from scheduling.passes import scheduling_pass

from .conftest import ACTOR

pytestmark = pytest.mark.docker

# The job's own disk is its /outputs (the pool's output_limit_mib, 1024 MiB by default) plus its
# scratch: a reservation that a job runs in holds at least that much scratch.
RESERVED_SCRATCH_MIB = 2048
TRAPPING = (
    "trap 'echo saved > \"$CHECKPOINT_DIR/state\"; exit 0' USR1; "
    "echo started; while true; do sleep 1; done"
)


def submitted(stack, name, command, **fields) -> int:
    response = stack.submit(name, command, **fields)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def reserve(http: requests.Session, stack, tenant_slug, start, *, cpu, memory, minutes=5):
    """A reservation through the lease API: a lease with a window."""
    body = {
        "pool": stack.pool.slug,
        "tenant": tenant_slug,
        "resources": {
            "cpu_millicores_min": cpu,
            "memory_mib_min": memory,
            "scratch_mib": RESERVED_SCRATCH_MIB,
        },
        "window": {
            "start": start.isoformat(),
            "end": (start + timedelta(minutes=minutes)).isoformat(),
            "tolerance_s": 60,
        },
    }
    response = http.post(f"{stack.url}/api/v1/compute-leases", json=body, timeout=30)
    assert response.status_code == 201, response.text
    return Lease.objects.get(pk=response.json()["id"])


def events(stack, job_id: int) -> list[dict]:
    return stack.api("GET", f"jobs/{job_id}/events").json()


def at(event: dict) -> datetime:
    return parse_datetime(event["at"])


def lease_reasons(lease: Lease) -> list[str]:
    return list(lease.events.order_by("id").values_list("reason", flat=True))


def wait_for(check, what: str, stack, timeout: float = 30, step=None):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout}s; agent log:\n{stack.agent.tail()}")
        if step is not None:
            step()
        time.sleep(0.2)


def end_job(stack, job_id: int) -> None:
    """Cancelled if it is still live, and its container gone."""
    if stack.job(job_id)["state"] not in ("succeeded", "failed", "cancelled", "lost"):
        stack.api("POST", f"jobs/{job_id}/cancel")
    wait_for(lambda: stack.containers(job_id) == [], f"job {job_id}'s container removed", stack)


def test_a_job_named_into_a_reservation_runs_inside_its_window_on_that_lease(stack):
    start = timezone.now() + timedelta(seconds=10)
    held = reserve(stack.http, stack, stack.tenant.slug, start, cpu=500, memory=256)
    assert held.state == LeaseState.RESERVED and held.window_start == start
    command = ["sh", "-c", "echo inside the window; sleep 1"]
    job_id = submitted(stack, "in-window", command, reservation=held.pk, max_runtime_s=120)
    try:
        # before the window: it waits for it, no lease, no container
        checks = 0
        while timezone.now() < start - timedelta(seconds=0.5):
            now = timezone.now()
            result = scheduling_pass(now=now)
            assert job_id not in result.placed
            job = stack.job(job_id)
            assert job["state"] == "queued"
            assert job["pending_reason"]["code"] == "reservation_window_not_open"
            assert job["pending_reason"]["reservation"] == held.pk
            assert stack.containers(job_id) == []
            assert not Lease.objects.filter(job_id=job_id).exists()
            checks += 1
            time.sleep(0.3)
        assert checks >= 5

        # the window opens: the pass hands it the reservation; it runs and succeeds
        job = stack.drive(job_id, "succeeded", timeout=40)
        assert job["exit_code"] == 0
        history = events(stack, job_id)
        reasons = [e["reason"] for e in history]
        assert reasons == [
            "submitted",
            "placed",
            "image_pulling",
            "image_pulled",
            "startup_began",
            "container_started",
            "results_uploaded",
            "exited_zero",
        ], reasons
        placed = history[1]
        assert placed["data"]["reservation"] == held.pk and at(placed) >= start
        running = next(e for e in history if e["to_state"] == "running")
        assert running["reason"] == "container_started" and at(running) >= start
        assert "inside the window" in stack.api("GET", f"jobs/{job_id}/logs").text

        # it ran on the reservation's lease, whose commit (the agent's `starting`) was the claim
        assert list(Lease.objects.filter(job_id=job_id).values_list("pk", flat=True)) == [held.pk]
        held.refresh_from_db()
        assert held.job_id == job_id and held.committed_at >= start
        assert held.state == LeaseState.RELEASED
        reasons = lease_reasons(held)
        assert reasons[:3] == ["reserved", "placed", "committed"], reasons
        assert "reservation_unclaimed" not in reasons
        # the unclaimed-reservation sweep past the tolerance leaves it alone: it was claimed
        release_unclaimed_reservations(now=held.window_start + timedelta(minutes=2))
        held.refresh_from_db()
        assert "reservation_unclaimed" not in lease_reasons(held)
        assert ledger_problems(stack.pool) == []
    finally:
        end_job(stack, job_id)


@pytest.fixture
def reserver(stack):
    """Another tenant of the pool, with a quota and a person's API session."""
    tenant = build_tenant("e2e-reserver", name="E2E reserver")
    Quota.objects.create(tenant=tenant, pool=stack.pool, cpu_millicores=64000, memory_mib=65536)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {build_token(build_person('e2e-bob', tenant=tenant))}"
    yield tenant, http
    http.close()


def test_a_backfilled_job_outlives_the_lease_ttl_and_is_reclaimed_before_the_window(
    stack, reserver, settings
):
    ttl = timedelta(seconds=4)
    settings.LEASE_DEFAULT_TTL = ttl  # the live server runs in this process (a thread)
    other, http = reserver
    lead = reclaim_lead(stack.pool)  # the module's stop grace (1 s) + the margin (20 s)
    node = stack.node()
    start = timezone.now() + timedelta(seconds=40)
    held = reserve(http, stack, other.slug, start, cpu=node.cpu_millicores_allocatable, memory=512)
    job_id = None
    try:
        # the node's CPU is all held from the window on: a checkpointable job backfills it
        job_id = submitted(
            stack,
            "backfiller",
            ["sh", "-c", TRAPPING],
            resources={"cpu_millicores_min": 500, "memory_mib_min": 64},
            checkpointable=True,
        )
        stack.drive(job_id, "running", timeout=20)
        lease = Lease.objects.get(job_id=job_id)
        assert lease.backfill_of_id == held.pk and lease.node_id == node.pk
        placed_at = lease.created_at

        # past the TTL, several times over: heartbeats renew the lease (up to the window start),
        # the expiry sweep finds nothing to expire, and it is not reclaimed yet
        while timezone.now() < placed_at + 2.5 * ttl:
            now = timezone.now()
            assert now < start - lead, "the test ran too slowly to see the TTL pass"
            expire_leases(now=now)
            assert reclaim_backfills(now=now) == []
            lease.refresh_from_db()
            assert lease.state == LeaseState.COMMITTED, lease_reasons(lease)
            # renewed with the short TTL (the server sees the override), never past the window
            assert now < lease.expires_at <= min(start, now + ttl + timedelta(seconds=1))
            assert stack.job(job_id)["state"] == "running"
            time.sleep(0.5)
        assert [c.status for c in stack.containers(job_id)] == ["running"]

        # `reclaim_lead` before the window: asked to checkpoint, with its reason
        time.sleep(max(0.0, (start - lead - timezone.now()).total_seconds()) + 0.1)
        expire_leases(now=timezone.now())
        assert reclaim_backfills(now=timezone.now()) == [job_id]
        assert stack.job(job_id)["state"] == "checkpointing"
        # the agent signals the job, uploads the checkpoint and reports it: re-queued
        wait_for(
            lambda: stack.job(job_id)["state"] == "queued",
            f"job {job_id} re-queued after its checkpoint",
            stack,
            timeout=20,
        )
        history = events(stack, job_id)
        asked = next(e for e in history if e["to_state"] == "checkpointing")
        assert asked["reason"] == "backfill_window_closed"
        # the checkpoint is the attempt's result: uploaded (results_uploaded), then reported
        assert [e["reason"] for e in history][-3:] == [
            "backfill_window_closed",
            "results_uploaded",
            "checkpoint_done",
        ]
        lease.refresh_from_db()
        assert lease.state == LeaseState.RELEASED and lease.ended_at < start
        outputs = {o["name"] for o in stack.api("GET", f"jobs/{job_id}/outputs").json()}
        assert "checkpoint.tar" in outputs
        archive = stack.api("GET", f"jobs/{job_id}/outputs/checkpoint.tar").content
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert tar.extractfile("checkpoint/state").read() == b"saved\n"
        wait_for(lambda: stack.containers(job_id) == [], "the container removed", stack)

        # it stays queued: the reservation's hold is not lent again this close to the window
        scheduling_pass(now=timezone.now())
        assert stack.job(job_id)["state"] == "queued"
        held.refresh_from_db()
        assert held.state == LeaseState.RESERVED
        assert ledger_problems(stack.pool) == []
    finally:
        if job_id is not None:
            end_job(stack, job_id)
        response = http.post(f"{stack.url}/api/v1/compute-leases/{held.pk}/release", json={})
        assert response.status_code == 200, response.text
        assert ledger_problems(stack.pool) == []


def test_a_head_that_fits_only_never_ready_nodes_does_not_hold_the_idle_pool(stack):
    big = build_node(stack.pool, "e2e-big-never-ready", cpu=32000, memory=65536, ready=False)
    prod = PriorityClass.objects.get_or_create(name="e2e-prod", defaults={"value": 1000})[0]
    head = small = None
    try:
        head = submitted(
            stack,
            "head",
            ["true"],
            resources={"cpu_millicores_min": 16000, "memory_mib_min": 1024},
            priority_class=prod.name,
        )
        small = submitted(stack, "small", ["sh", "-c", "echo small ran"])
        for _ in range(2):
            scheduling_pass(now=timezone.now())
            if Job.objects.get(pk=small).state != "queued":
                break
        assert Job.objects.get(pk=small).state != "queued", stack.job(small)["pending_reason"]
        assert Lease.objects.get(job_id=small).node_id == stack.node().pk
        head_job = stack.job(head)
        assert head_job["state"] == "queued"
        assert head_job["pending_reason"]["code"] == "no_ready_node", head_job["pending_reason"]

        job = stack.drive(small, "succeeded", timeout=30)
        assert job["exit_code"] == 0
        assert "small ran" in stack.api("GET", f"jobs/{small}/logs").text
        assert stack.job(head)["state"] == "queued"
        assert not Lease.objects.filter(job_id=head).exists()
        assert ledger_problems(stack.pool) == []
    finally:
        for job_id in (j for j in (head, small) if j is not None):
            end_job(stack, job_id)
        node_services.node_retire(node=big, actor=ACTOR, message="the e2e test is done with it")
