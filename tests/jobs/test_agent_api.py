"""The agent's job API (docs/data-plane.md) with a node credential: what the node is assigned,
the steps it reports driving the job's lifecycle, fencing, logs and outputs."""

from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.utils import timezone

from config import builders
from config.builders import SYSTEM, build_secret, gpu_request, submit_job
from jobs import lifecycle
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_submit
from leases.choices import HOLDING, LeaseState
from nodes import services as node_services
from pools import encryption
from pools.actors import Actor
from pools.reasons import Reason
from pools.services import policy_version_publish
from scheduling.drain import node_drain_enforce
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client, client_for
from worker_agent.runtime.base import END_STEPS, Step

RETRY_TWICE = {"max_attempts": 2, "backoff_s": 60, "retry_on": ["exited_nonzero"]}


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


def place(job, now=None) -> tuple[Job, object]:
    """Through the scheduling pass, as Celery beat runs it: the job leased, and its lease."""
    assert job.pk in scheduling_pass(pool_id=job.pool_id, now=now).placed
    job.refresh_from_db()
    return job, job.leases.get(state=LeaseState.RESERVED)


def report(api, job, lease, step, **body):
    body = {"fencing_token": str(lease.fencing_token), "step": step, **body}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")


def run(api, job, lease):
    """What the agent reports until the container runs."""
    for step in ("pulling", "starting", "running"):
        assert report(api, job, lease, step).status_code == 200, step


def test_assignment_carries_the_run_with_limits_and_secret_values(agent, node_api, tenant):
    build_secret(tenant, "api-token", "s3cr3t-value-42")
    job = submit_job(
        agent.node.pool,
        tenant,
        env={"A": "1"},
        secrets={"TOKEN": "api-token"},
        command=["sh", "-c", "echo hi > /outputs/greeting.txt"],
    )
    job, lease = place(job)

    response = node_api.get("/api/v1/agent/assignments")

    assert response.status_code == 200
    [entry] = response.json()
    assert entry["job"] == job.pk and entry["lease"] == lease.pk and entry["attempt"] == 1
    assert entry["fencing_token"] == str(lease.fencing_token)
    assert entry["state"] == "leased" and entry["tenant"] == tenant.slug
    assert entry["image"] == job.image and "@sha256:" in entry["image"]
    assert entry["command"] == ["sh", "-c", "echo hi > /outputs/greeting.txt"]
    assert entry["env"] == {"A": "1"}
    assert entry["secrets"] == {"TOKEN": "s3cr3t-value-42"}
    assert entry["limits"] == {
        "cpu_millicores": 1000,
        "memory_mib": 512,
        "scratch_mib": 0,  # the lease's disk is /outputs alone: the pool's default limit
        "output_limit_mib": 1024,
        "pids": 1024,
        "cpuset": None,
        "gpus": [],
        "gpu_isolation": "none",
    }
    assert entry["runtime"] == "docker"
    assert (entry["startup_timeout_s"], entry["stop_grace_s"]) == (300, 10)
    assert entry["checkpoint_requested"] is False


def test_a_secret_that_cannot_be_decrypted_fails_its_job_alone(agent, node_api, tenant):
    """Its key left the ring: that job fails with the reason, the node's other work is still
    assigned (the whole list answered 500 before)."""
    build_secret(tenant, "lost-key", "sealed-under-a-removed-key")
    doomed, _ = place(submit_job(agent.node.pool, tenant, secrets={"TOKEN": "lost-key"}))
    fine, _ = place(submit_job(agent.node.pool, tenant))

    with override_settings(ENCRYPTION_KEYS={"other": encryption.new_key()}):
        response = node_api.get("/api/v1/agent/assignments")

    assert response.status_code == 200
    assert [entry["job"] for entry in response.json()] == [fine.pk]
    doomed.refresh_from_db()
    assert doomed.state == JobState.FAILED
    event = doomed.events.order_by("-id").first()
    assert event.reason == Reason.SECRET_UNREADABLE and "lost-key" in event.message
    assert not doomed.leases.filter(state__in=HOLDING).exists()


def test_gpu_lease_assigns_its_exact_devices(agent, node_api, tenant, member):
    job = job_submit(
        tenant=tenant,
        pool=agent.node.pool,
        name="gpu",
        image=builders.TEST_IMAGE,
        actor=Actor.for_user(member),
        resources=gpu_request(count=1),
    )
    job, lease = place(job)
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    uuid = agent.node.gpus.get(pk=lease.gpu_allocations[0]["gpu"]).uuid
    assert entry["limits"]["gpus"] == [uuid]


def test_another_node_is_assigned_nothing_and_may_not_report(agent, enroll, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    other = enroll(agent.node.pool)
    node_services.node_heartbeat(node=other.node, actor=Actor.for_node(other.node))
    other_api = bearer_client(other.secret)

    assert other_api.get("/api/v1/agent/assignments").json() == []
    response = report(other_api, job, lease, "starting")
    assert response.status_code == 403 and response.json()["code"] == "outside_node_scope"


def test_process_runtime_only_where_the_pool_allows_it(agent, node_api, tenant):
    pool = agent.node.pool
    place(submit_job(pool, tenant))
    actor = Actor.for_node(agent.node)
    node_services.node_heartbeat(node=agent.node, actor=actor, runtime="process")
    assert node_api.get("/api/v1/agent/assignments").json()[0]["runtime"] == "docker"
    policy_version_publish(
        policy=pool.scheduling_policy,
        weights={"bin_pack": 1.0},
        knobs={"allow_process_runtime": True, "startup_timeout_s": 60},
        comment="development pool",
        actor=SYSTEM,
    )
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert entry["runtime"] == "process" and entry["startup_timeout_s"] == 60


def require_runtime(pool, runtime: str, **knobs) -> None:
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=pool.scheduling_policy,
        weights=dict(current.weights),
        knobs=dict(current.knobs or {}) | {"required_runtime": runtime, **knobs},
        comment=f"requires {runtime}",
        actor=SYSTEM,
    )


def offer(enrolled, runtimes: list[str]):
    """A heartbeat of `enrolled`'s agent, over the API, saying which runtimes it offers."""
    body = {"runtime": "docker", "runtimes": runtimes}
    return bearer_client(enrolled.secret).post("/api/v1/agent/heartbeat", body, format="json")


def test_a_gvisor_job_is_placed_only_where_gvisor_is_offered_and_assigned_it(
    agent, enroll, tenant, member
):
    pool = agent.node.pool
    assert offer(agent, ["docker", "process"]).status_code == 200
    sandboxed = enroll(pool)
    assert offer(sandboxed, ["docker", "gvisor", "process"]).status_code == 200
    submit = dict(
        tenant=tenant,
        pool=pool,
        name="untrusted",
        image=builders.pinned_test_image(),
        actor=Actor.for_user(member),
        resources=builders.cpu_request(container_runtime="gvisor"),
    )
    job = job_submit(**submit)
    # its dockerd lost the runsc runtimes: the next heartbeat says so, and the job waits
    assert offer(sandboxed, ["docker", "process"]).status_code == 200
    assert job.pk not in scheduling_pass(pool_id=pool.pk).placed
    job.refresh_from_db()
    assert job.pending_reason["message"].startswith("0 of 2 nodes: 2 runtime_unsupported")

    assert offer(sandboxed, ["docker", "gvisor", "process"]).status_code == 200
    sandboxed.node.refresh_from_db()
    assert sandboxed.node.runtimes == ["docker", "gvisor", "process"]
    job, lease = place(job)
    assert lease.node_id == sandboxed.node.pk
    [entry] = bearer_client(sandboxed.secret).get("/api/v1/agent/assignments").json()
    assert entry["runtime"] == "gvisor"
    # the node that runs runc only is given nothing
    assert bearer_client(agent.secret).get("/api/v1/agent/assignments").json() == []


@pytest.mark.parametrize("runtimes", [["runc"], ["docker", "gvisor "], "gvisor", [None]])
def test_a_heartbeat_offering_unknown_runtimes_is_a_400(agent, runtimes):
    before = list(agent.node.runtimes)
    response = offer(agent, runtimes)
    assert response.status_code == 400 and "runtimes" in response.json()["errors"]
    agent.node.refresh_from_db()
    assert agent.node.runtimes == before


def test_a_pool_requiring_gvisor_assigns_it_to_work_queued_before(agent, node_api, tenant):
    pool = agent.node.pool
    place(submit_job(pool, tenant))  # submitted as a Docker job, before the pool required more
    assert node_api.get("/api/v1/agent/assignments").json()[0]["runtime"] == "docker"
    require_runtime(pool, "gvisor")
    # never run weaker than the pool requires: a node without gVisor refuses it instead
    assert node_api.get("/api/v1/agent/assignments").json()[0]["runtime"] == "gvisor"


def test_a_pool_requiring_docker_never_assigns_the_process_runtime(agent, node_api, tenant):
    pool = agent.node.pool
    place(submit_job(pool, tenant))
    node_services.node_heartbeat(
        node=agent.node, actor=Actor.for_node(agent.node), runtime="process"
    )
    require_runtime(pool, "docker", allow_process_runtime=True)
    assert node_api.get("/api/v1/agent/assignments").json()[0]["runtime"] == "docker"
    require_runtime(pool, "", allow_process_runtime=True)
    assert node_api.get("/api/v1/agent/assignments").json()[0]["runtime"] == "process"


def test_a_node_refusing_a_runtime_it_lacks_fails_the_job_with_that_reason(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    message = "runtime gvisor is not offered by this node's agent"
    response = report(node_api, job, lease, "failed", reason="runtime_unavailable", message=message)
    assert response.status_code == 200 and response.json()["state"] == "failed"
    event = job.events.order_by("id").last()
    assert (event.reason, event.message) == ("runtime_unavailable", message)


def test_reports_drive_the_job_to_success_and_release_its_lease(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant, ports=[8080]))

    response = report(node_api, job, lease, "pulling", pull_seconds=1.5)
    assert response.status_code == 200 and response.json()["state"] == "leased"
    assert job.events.latest("id").reason == Reason.IMAGE_PULLED
    assert job.events.latest("id").data == {"pull_seconds": 1.5}

    assert report(node_api, job, lease, "starting").json()["state"] == "starting"
    lease.refresh_from_db()
    assert lease.state == LeaseState.COMMITTED
    # the agent retried a report whose answer it lost: same answer, nothing twice
    assert report(node_api, job, lease, "starting").json()["state"] == "starting"
    assert job.events.filter(reason=Reason.STARTUP_BEGAN).count() == 1

    route = {"host": "10.0.0.5", "ports": {"8080": 32768}}
    assert report(node_api, job, lease, "running", route=route).json()["state"] == "running"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.route == route and lease.route == route
    assert job.events.latest("id").reason == Reason.CONTAINER_STARTED
    assert node_api.get("/api/v1/agent/assignments").json()[0]["state"] == "running"

    response = report(node_api, job, lease, "succeeded", exit_code=0)
    assert response.status_code == 200 and response.json()["state"] == "succeeded"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.exit_code == 0 and job.events.latest("id").reason == Reason.EXITED_ZERO
    assert lease.state == LeaseState.RELEASED
    assert lease.events.last().reason == Reason.RELEASED_JOB_ENDED
    agent.node.refresh_from_db()
    assert agent.node.cpu_millicores_reserved == 0
    assert node_api.get("/api/v1/agent/assignments").json() == []


def test_a_step_out_of_order_is_refused(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    response = report(node_api, job, lease, "succeeded")
    assert response.status_code == 409 and response.json()["code"] == "transition_not_allowed"
    job.refresh_from_db()
    assert job.state == JobState.LEASED


def test_stale_fencing_token_is_refused(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    body = {"fencing_token": str(lease.fencing_token + 1), "step": "starting"}
    response = node_api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
    assert response.status_code == 409 and response.json()["code"] == "fencing_token_mismatch"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.LEASED and lease.state == LeaseState.RESERVED


def test_a_cancelled_job_is_stopped_then_leaves_the_assignments_and_refuses_its_old_attempt(
    agent, node_api, tenant
):
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(node_api, job, lease)
    job_cancel(job=job, actor=SYSTEM)
    (stopping,) = node_api.get("/api/v1/agent/assignments").json()
    assert (stopping["lease"], stopping["state"], stopping["secrets"]) == (lease.pk, "stopping", {})
    # the container ended before the agent saw the cancel: that end confirms the stop
    response = report(node_api, job, lease, "succeeded")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED and lease.events.last().reason == "stop_confirmed"
    assert node_api.get("/api/v1/agent/assignments").json() == []
    response = report(node_api, job, lease, "succeeded")
    assert response.status_code == 409 and response.json()["code"] == "lease_ended"


def test_failure_is_retried_by_policy_after_backoff_then_fails_for_good(agent, node_api, tenant):
    job = submit_job(agent.node.pool, tenant, retry_policy=RETRY_TWICE)
    job, lease = place(job)
    run(node_api, job, lease)
    before = timezone.now()

    response = report(node_api, job, lease, "failed", reason="exited_nonzero", exit_code=3)

    assert response.status_code == 200 and response.json()["state"] == "queued"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    event = job.events.latest("id")
    assert (event.from_state, event.reason) == ("running", Reason.RETRY_SCHEDULED)
    assert event.data["failure"] == "exited_nonzero" and event.data["exit_code"] == 3
    assert before + timedelta(seconds=60) <= job.not_before <= timezone.now() + timedelta(60)
    # not placed again before its backoff
    assert job.pk not in scheduling_pass(pool_id=job.pool_id).placed
    job, second = place(job, now=job.not_before + timedelta(seconds=1))
    assert job.attempts == 2 and second.pk != lease.pk
    # the first attempt's callbacks no longer touch the second
    stale = report(node_api, job, lease, "failed", reason="exited_nonzero", exit_code=3)
    assert stale.status_code == 409
    run(node_api, job, second)

    response = report(node_api, job, second, "failed", reason="exited_nonzero", exit_code=3)

    assert response.json()["state"] == "failed"
    job.refresh_from_db()
    assert job.exit_code == 3 and job.events.latest("id").reason == Reason.EXITED_NONZERO


def test_failure_not_in_retry_on_fails_with_its_reason(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant, retry_policy=RETRY_TWICE))
    run(node_api, job, lease)
    response = report(node_api, job, lease, "failed", reason="oom_killed", exit_code=137)
    assert response.json()["state"] == "failed"
    job.refresh_from_db()
    assert job.events.latest("id").reason == Reason.OOM_KILLED and job.exit_code == 137


def test_image_pull_failure_before_start(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    report(node_api, job, lease, "pulling")
    response = report(node_api, job, lease, "failed", reason="image_pull_failed")
    assert response.json()["state"] == "failed"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.events.latest("id").reason == Reason.IMAGE_PULL_FAILED
    assert job.exit_code is None and lease.state == LeaseState.RELEASED


@pytest.mark.parametrize(
    "body, field",
    [
        ({"step": "failed"}, "reason"),
        ({"step": "failed", "reason": "exited_nonzero"}, "exit_code"),
        ({"step": "failed", "reason": "exited_zero"}, "reason"),
        ({"step": "running", "route": {"host": "h", "ports": {"x": 1}}}, "route"),
        ({"step": "exploded"}, "step"),
        ({"step": "pulling", "pull_seconds": -1}, "pull_seconds"),
        ({"step": "starting", "fencing_token": "12a"}, "fencing_token"),
    ],
)
def test_malformed_reports_are_400_with_field_errors(agent, node_api, tenant, body, field):
    job, lease = place(submit_job(agent.node.pool, tenant))
    response = report(node_api, job, lease, **body)
    assert response.status_code == 400 and field in response.json()


def test_logs_and_outputs_upload_during_and_after_the_run(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(node_api, job, lease)
    token = str(lease.fencing_token)
    url = f"/api/v1/agent/jobs/{job.pk}"

    response = node_api.post(
        f"{url}/logs", {"fencing_token": token, "text": "hello\n"}, format="json"
    )
    assert response.status_code == 200
    files = [SimpleUploadedFile("greeting.txt", b"hello\n"), SimpleUploadedFile("b.bin", b"")]
    response = node_api.post(f"{url}/outputs", {"fencing_token": token, "files": files})
    assert response.status_code == 201
    assert [o["name"] for o in response.json()["outputs"]] == ["greeting.txt", "b.bin"]
    assert response.json()["outputs"][0]["size"] == 6
    stale = node_api.post(f"{url}/logs", {"fencing_token": "1", "text": "x"}, format="json")
    assert stale.status_code == 409 and stale.json()["code"] == "fencing_token_mismatch"
    bad = node_api.post(
        f"{url}/outputs",
        {"fencing_token": token, "files": [SimpleUploadedFile("x..y", b"x")]},
    )
    assert bad.status_code == 400 and "files" in bad.json()
    report(node_api, job, lease, "succeeded")
    # the agent's final report is in: nothing more under that lease (tests/security/
    # test_callbacks.py has the rest of the rule)
    response = node_api.post(
        f"{url}/logs", {"fencing_token": token, "text": "bye\n"}, format="json"
    )
    assert response.status_code == 409 and response.json()["code"] == "lease_ended"
    assert "".join(job.log_chunks.values_list("text", flat=True)) == "hello\n"
    assert sorted(job.outputs.values_list("name", "size")) == [("b.bin", 0), ("greeting.txt", 6)]


def test_skipped_outputs_come_with_the_final_report_as_an_event(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(node_api, job, lease)
    skipped = [{"name": "checkpoint", "reason": "symlink"}, {"name": "pipe", "reason": "fifo"}]
    response = report(
        node_api, job, lease, "succeeded", outputs_skipped=skipped, outputs_skipped_total=3
    )
    assert response.status_code == 200
    event = job.events.get(reason=Reason.OUTPUTS_SKIPPED)
    assert event.data == {"skipped": skipped, "total": 3}
    assert event.from_state == event.to_state == JobState.RUNNING
    assert "checkpoint (symlink)" in event.message and "1 more" not in event.message
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


@pytest.mark.parametrize(
    "body",
    [
        {"step": "running", "outputs_skipped": [{"name": "x", "reason": "fifo"}]},
        {"step": "succeeded", "outputs_skipped": [{"name": "x", "reason": "because"}]},
        {"step": "succeeded", "outputs_skipped": [{"name": "x" * 256, "reason": "fifo"}]},
        {"step": "succeeded", "outputs_skipped": [{"name": "x", "reason": "fifo"}] * 101},
        {"step": "succeeded", "outputs_skipped": "symlink"},
    ],
)
def test_malformed_skipped_outputs_are_400(agent, node_api, tenant, body):
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(node_api, job, lease)
    response = report(node_api, job, lease, **body)
    assert response.status_code == 400 and "outputs_skipped" in response.json()["errors"]
    assert not job.events.filter(reason=Reason.OUTPUTS_SKIPPED).exists()


def test_agent_endpoints_refuse_people(agent, tenant, member, api):
    job, _ = place(submit_job(agent.node.pool, tenant))
    client = api(member)
    assert client.get("/api/v1/agent/assignments").status_code == 403
    response = client.post(f"/api/v1/agent/jobs/{job.pk}/report", {}, format="json")
    assert response.status_code == 403


def test_a_drain_checkpoint_is_asked_of_the_agent_and_checkpointed_requeues(
    agent, node_api, tenant
):
    job, lease = place(submit_job(agent.node.pool, tenant, checkpointable=True))
    run(node_api, job, lease)
    # a checkpoint nobody asked for is refused: the job keeps running
    refused = report(node_api, job, lease, "checkpointed")
    assert refused.status_code == 409 and refused.json()["code"] == "transition_not_allowed"
    now = timezone.now()
    node_services.node_drain(node=agent.node, actor=SYSTEM, deadline=now + timedelta(seconds=1))
    assert node_drain_enforce(node=agent.node, actor=SYSTEM, now=now + timedelta(seconds=2)) == {
        "checkpointing": [job.pk],
        "requeued": [],
        "failed": [],
        "left_running": [],
    }
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert entry["state"] == "checkpointing" and entry["checkpoint_requested"] is True

    response = report(node_api, job, lease, "checkpointed")

    assert response.status_code == 200 and response.json()["state"] == "queued"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.events.latest("id").reason == Reason.CHECKPOINT_DONE
    assert lease.state == LeaseState.RELEASED
    assert node_api.get("/api/v1/agent/assignments").json() == []


def test_pull_time_is_kept_per_image_on_the_node_and_shown_in_the_node_api(
    agent, node_api, tenant, operator
):
    job, lease = place(submit_job(agent.node.pool, tenant))
    assert report(node_api, job, lease, "pulling", reason="image_pulling").status_code == 200
    assert report(node_api, job, lease, "pulling", pull_seconds=2.25).status_code == 200
    digest = job.image.partition("@")[2]
    shown = client_for(operator).get(f"/api/v1/nodes/{agent.node.pk}").json()
    assert shown["image_pull_seconds"] == {digest: 2.25}
    too_long = report(node_api, job, lease, "pulling", pull_seconds=86401)
    assert too_long.status_code == 400 and "pull_seconds" in too_long.json()


def test_the_agent_reports_the_steps_this_api_takes():
    """The agent's steps (an enum of its own: it imports nothing of the control plane) are the
    strings the report's serializer accepts."""
    assert [str(step) for step in Step] == list(lifecycle.STEPS)
    assert {str(step) for step in END_STEPS} == set(lifecycle.END_STEPS)
