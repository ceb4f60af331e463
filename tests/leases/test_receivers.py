"""What a node's heartbeat means to the ledger (leases/receivers.py): the leases of the jobs it
runs are renewed without an event each time, their usage is recorded (latest, peak, average),
and the node's image cache and runtime feed the scheduler."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from config.builders import submit_job
from jobs.lifecycle import job_report
from leases.choices import LeaseState
from leases.snapshot import pool_snapshot
from pools.actors import Actor
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client

DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


def placed(agent, tenant, *, steps=("starting", "running"), memory=512):
    job = submit_job(agent.node.pool, tenant, memory=memory)
    scheduling_pass(pool_id=job.pool_id)
    lease = job.leases.get()
    actor = Actor.for_node(agent.node)
    for step in steps:
        job_report(
            job=job, node=agent.node, fencing_token=lease.fencing_token, step=step, actor=actor
        )
    lease.refresh_from_db()
    return job, lease


def beat(api, *workloads, **body):
    return api.post(
        "/api/v1/agent/heartbeat", {"workloads": list(workloads), **body}, format="json"
    )


def workload(job, lease, **usage):
    return {"lease": lease.pk, "job": job.pk, "state": "running", "usage": usage}


def test_heartbeat_renews_running_jobs_leases_without_an_event(agent, node_api, tenant):
    job, lease = placed(agent, tenant)
    waiting, reserved = placed(agent, tenant, steps=())  # leased, not started: no renewal
    events = lease.events.count()
    before = timezone.now()

    response = beat(node_api, workload(job, lease), workload(waiting, reserved))

    assert response.status_code == 200
    lease.refresh_from_db()
    reserved_expiry = reserved.expires_at
    reserved.refresh_from_db()
    assert lease.expires_at >= before + settings.LEASE_DEFAULT_TTL
    assert reserved.expires_at == reserved_expiry
    assert lease.events.count() == events
    assert not lease.events.filter(reason=Reason.RENEWED).exists()


def test_heartbeat_never_shortens_or_revives_a_lease(agent, node_api, tenant):
    job, lease = placed(agent, tenant)
    far = timezone.now() + timedelta(days=1)
    type(lease).objects.filter(pk=lease.pk).update(expires_at=far)
    beat(node_api, workload(job, lease))
    lease.refresh_from_db()
    assert lease.expires_at == far
    job_report(
        job=job,
        node=agent.node,
        fencing_token=lease.fencing_token,
        step="succeeded",
        actor=Actor.for_node(agent.node),
    )
    assert beat(node_api, workload(job, lease)).status_code == 200
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED


def test_usage_latest_peak_and_average(agent, node_api, tenant):
    job, lease = placed(agent, tenant, memory=1024)
    for cpu, memory in ((500, 100), (1500, 300), (1000, 200)):
        sample = workload(job, lease, cpu_millicores=cpu, memory_mib=memory)
        assert beat(node_api, sample).status_code == 200
    lease.refresh_from_db()
    assert (lease.used_cpu_millicores, lease.used_memory_mib) == (1000, 200)
    assert lease.usage_samples == 3
    assert lease.usage_peak["cpu_millicores"] == 1500 and lease.usage_peak["memory_mib"] == 300
    assert lease.usage_average["cpu_millicores"] == 1000.0
    assert lease.usage_average["memory_mib"] == 200.0


@pytest.mark.parametrize(
    "usage",
    [
        {"memory_mib": 4096},  # beyond the lease's memory (the container's hard limit)
        {"gpu_memory_mib": 10},  # a CPU lease holds no GPU
        {"gpu_utilization_percent": 101},
        {"cpu_millicores": -1},
        {"cpu_millicores": "lots"},
    ],
)
def test_usage_out_of_bounds_is_400_and_writes_nothing(agent, node_api, tenant, usage):
    job, lease = placed(agent, tenant, memory=1024)
    expires_at = lease.expires_at
    response = beat(node_api, workload(job, lease, **usage))
    assert response.status_code == 400
    lease.refresh_from_db()
    assert lease.usage_samples == 0 and lease.expires_at == expires_at


def test_images_and_runtime_reach_the_node_and_the_scheduler(agent, node_api):
    response = beat(node_api, images=[DIGEST, DIGEST], runtime="process")
    assert response.status_code == 200
    agent.node.refresh_from_db()
    assert agent.node.cached_images == [DIGEST] and agent.node.agent_runtime == "process"
    [view] = pool_snapshot(agent.node.pool_id).nodes
    assert view.warm_images == frozenset({DIGEST})
    # a heartbeat without `images` keeps what is known
    beat(node_api)
    agent.node.refresh_from_db()
    assert agent.node.cached_images == [DIGEST]


@pytest.mark.parametrize(
    "body",
    [
        {"images": ["busybox:latest"]},
        {"images": ["sha256:" + "A" * 64]},
        {"images": [DIGEST] * 513},
        {"runtime": "kubernetes"},
    ],
)
def test_malformed_images_or_runtime_are_400(node_api, body):
    assert beat(node_api, **body).status_code == 400


def test_a_warm_node_is_preferred_for_the_jobs_image(agent, enroll, tenant):
    pool = agent.node.pool
    other = enroll(pool)
    bearer_client(other.secret).post("/api/v1/agent/heartbeat", {}, format="json")
    job = submit_job(pool, tenant)
    digest = job.image.rsplit("@", 1)[1]
    beat(bearer_client(other.secret), images=[digest])
    scheduling_pass(pool_id=pool.pk)
    assert job.leases.get().node_id == other.node.pk


def test_heartbeat_renews_a_backfilled_jobs_lease_up_to_the_window_start(
    agent, node_api, tenant, other_tenant, settings
):
    """A job that ran by backfilling got the 300 s default lease, never renewed: after about
    five minutes it ended `lost`. Heartbeats renew it, to the reservation's window start."""
    from config.builders import SYSTEM, cpu_request
    from leases import services

    node = agent.node
    node.refresh_from_db()
    now = timezone.now()
    window = services.Window(now + timedelta(minutes=30), now + timedelta(hours=1), timedelta(0))
    whole = cpu_request(
        node.cpu_millicores_allocatable,
        node.memory_mib_allocatable,
        scratch=node.scratch_mib_allocatable,
    )
    held = services.lease_reserve(
        pool=node.pool,
        tenant=other_tenant,
        request=whole,
        actor=SYSTEM,
        duration=timedelta(minutes=5),
        window=window,
    )
    job = submit_job(node.pool, tenant, memory=512, max_runtime_s=600)  # ends in time
    assert scheduling_pass(pool_id=job.pool_id).placed == [job.pk]  # by backfilling
    lease = job.leases.get()
    assert lease.backfill_of_id == held.pk
    actor = Actor.for_node(node)
    for step in ("starting", "running"):
        job_report(job=job, node=node, fencing_token=lease.fencing_token, step=step, actor=actor)
    before = timezone.now()
    beat(node_api, workload(job, lease))
    lease.refresh_from_db()
    assert lease.expires_at >= before + settings.LEASE_DEFAULT_TTL  # renewed like any lease
    settings.LEASE_DEFAULT_TTL = timedelta(hours=2)  # a renewal past the window's opening
    beat(node_api, workload(job, lease))
    lease.refresh_from_db()
    assert lease.expires_at == window.start  # never past the window's opening
