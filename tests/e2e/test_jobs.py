"""End to end through the whole stack (tests/e2e/conftest.py): a tenant submits over HTTP, the
scheduling pass places the job, a real agent process pulls the image by digest and runs it in a
container on the real Docker engine, and the tenant reads the outcome, the logs and the outputs
over HTTP. Each test leaves its job ended, so the next one finds the node empty."""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import build_secret, pinned_test_image
from leases import tasks as lease_tasks
from leases.models import Lease
from nodes.services import node_heartbeat_sweep
from pools.services import policy_version_publish
from scheduling import tasks as scheduling_tasks

from .conftest import ACTOR

pytestmark = pytest.mark.docker


def lease_states(job_id: int) -> list[str]:
    return list(Lease.objects.filter(job_id=job_id).order_by("id").values_list("state", flat=True))


def submitted(stack, name, command, **fields) -> int:
    response = stack.submit(name, command, **fields)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_job_runs_by_digest_and_its_output_is_downloaded(stack):
    command = ["sh", "-c", "echo greeting the world; echo hello > /outputs/greeting.txt"]
    response = stack.submit("greeting", command)
    assert response.status_code == 201, response.text
    job = response.json()
    # The tag was resolved at submit: the job stores and runs the digest only.
    assert job["image"] == pinned_test_image() and "@sha256:" in job["image"]
    assert job["image_requested"] == "127.0.0.1:5000/computepool/busybox:test"

    job = stack.drive(job["id"], "succeeded")
    assert job["exit_code"] == 0
    assert stack.reasons(job["id"]) == [
        "submitted",
        "placed",
        "image_pulling",
        "image_pulled",
        "startup_began",
        "container_started",
        "results_uploaded",
        "exited_zero",
    ]
    outputs = stack.api("GET", f"jobs/{job['id']}/outputs").json()
    assert [(o["name"], o["size"], o["sha256"]) for o in outputs] == [
        ("greeting.txt", 6, hashlib.sha256(b"hello\n").hexdigest())
    ]
    download = stack.api("GET", f"jobs/{job['id']}/outputs/greeting.txt")
    assert download.status_code == 200 and download.content == b"hello\n"
    logs = stack.api("GET", f"jobs/{job['id']}/logs", params={"tail": 10})
    assert logs.status_code == 200 and "greeting the world" in logs.text
    # The engine holds the image under the digest the job named; the lease ended with the job.
    assert stack.docker.images.get(job["image"]).id
    assert lease_states(job["id"]) == ["released"]
    # removed right after its final report (the agent reports first)
    stack.drive(job["id"], lambda job: stack.containers(job["id"]) == [], timeout=10)


def test_a_job_reads_its_secret_from_a_file_and_its_log_masks_it(stack):
    build_secret(stack.tenant, "e2e-db-pass", "e2e-s3cr3t-value")
    command = [
        "sh",
        "-c",
        'echo "pass=$(cat "$DB_PASS_FILE")"; echo "in env: $(env | grep -c s3cr3t)"; '
        "stat -c 'mode=%a owner=%u' /run/secrets/DB_PASS",
    ]
    job_id = submitted(stack, "secret-file", command, secrets={"DB_PASS": "e2e-db-pass"})
    stack.drive(job_id, "succeeded")
    logs = stack.api("GET", f"jobs/{job_id}/logs").text
    assert logs.splitlines() == ["pass=[secret e2e-db-pass]", "in env: 0", "mode=400 owner=65534"]


def test_a_nul_the_job_prints_keeps_every_line_around_it(stack):
    """The agent's chunk holding the NUL used to be a 400: the lines of those 2 s were lost."""
    command = ["sh", "-c", "echo before; printf 'in\\000side\\n'; echo after"]
    job_id = submitted(stack, "nul-byte", command)
    stack.drive(job_id, "succeeded")
    logs = stack.api("GET", f"jobs/{job_id}/logs").text
    assert logs == "before\nin\ufffdside\nafter\n"


def test_a_nonzero_exit_fails_the_job_with_its_code(stack):
    job_id = submitted(stack, "exit-3", ["sh", "-c", "echo bad input >&2; exit 3"])
    job = stack.drive(job_id, "failed")
    assert job["exit_code"] == 3
    assert stack.reasons(job_id)[-1] == "exited_nonzero"
    assert "bad input" in stack.api("GET", f"jobs/{job_id}/logs").text
    assert lease_states(job_id) == ["released"]


def test_a_memory_hog_is_oom_killed(stack):
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    resources = {"cpu_millicores_min": 500, "memory_mib_min": 16}
    job_id = submitted(stack, "hog", hog, resources=resources)
    job = stack.drive(job_id, "failed", timeout=60)
    assert stack.reasons(job_id)[-1] == "oom_killed"
    assert job["exit_code"] == 137


def test_a_missing_image_is_refused_at_submit(stack):
    response = stack.submit("ghost", ["true"], image="127.0.0.1:5000/computepool/nothing:here")
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "image_invalid"
    listed = stack.api("GET", "jobs", params={"pool__slug": stack.pool.slug}).json()
    assert "ghost" not in [job["name"] for job in listed.get("results", listed)]


def test_a_sleeper_is_killed_at_its_maximum_runtime(stack):
    job_id = submitted(stack, "sleeper", ["sleep", "60"], max_runtime_s=1)
    stack.drive(job_id, "failed", timeout=30)
    assert stack.reasons(job_id)[-1] == "max_runtime_exceeded"
    stack.drive(job_id, lambda job: stack.containers(job_id) == [], timeout=10)


@contextmanager
def stop_grace(stack, seconds: int):
    """The pool's stop grace for the jobs placed meanwhile (the module's is 1 s)."""
    policy = stack.pool.scheduling_policy

    def publish(grace):
        knobs = dict(policy.current.knobs or {}) | {"stop_grace_s": grace}
        policy_version_publish(
            policy=policy, weights=dict(policy.current.weights), knobs=knobs, actor=ACTOR
        )

    publish(seconds)
    try:
        yield
    finally:
        publish(1)


def lease_of(job_id: int) -> Lease:
    return Lease.objects.filter(job_id=job_id).order_by("-id").first()


def test_a_cancelled_jobs_capacity_is_placed_again_only_once_its_container_stopped(stack):
    """The first job takes the node's whole CPU and is cancelled: its lease is `stopping`
    (capacity held) through the stop grace, until the agent has stopped and removed the
    container and said so; only then does the next job of the same size get the node."""
    node = stack.node()
    whole = {"cpu_millicores_min": node.cpu_millicores_allocatable, "memory_mib_min": 64}
    first = second = None
    with stop_grace(stack, 4):
        try:
            first = submitted(stack, "whole-node", ["sleep", "300"], resources=whole)
            stack.drive(first, "running")
            assert [c.status for c in stack.containers(first)] == ["running"]
            response = stack.api("POST", f"jobs/{first}/cancel")
            assert response.status_code == 200 and response.json()["state"] == "cancelled"
            cancelled_at = timezone.now()
            assert lease_states(first) == ["stopping"]  # held: nothing lands during the grace
            second = submitted(stack, "next", ["sleep", "300"], resources=whole)
            seen_stopping = 0
            while stack.containers(first):
                scheduling_tasks.scheduling_pass()
                if lease_states(first) == ["stopping"]:
                    seen_stopping += 1
                assert stack.job(second)["state"] == "queued", "placed while the container runs"
                assert timezone.now() - cancelled_at < timedelta(seconds=30), stack.agent.tail()
                time.sleep(0.2)
            assert seen_stopping  # the lease held while the container was stopping
            stack.drive(second, "running")
            stopped = lease_of(first)
            assert stopped.state == "released"
            assert [e.reason for e in stopped.events.order_by("id")][-2:] == [
                "stop_requested",
                "stop_confirmed",
            ]
            # the container got its grace (SIGTERM is ignored by a shell's `sleep` as PID 1)
            assert stopped.ended_at - cancelled_at >= timedelta(seconds=3)
            # placed after the stop was confirmed: in commit order (a pass stamps its leases with
            # the `now` it started at, which may precede a release it then reads)
            confirmed = stopped.events.order_by("id").last()
            assert lease_of(second).events.order_by("id").first().pk > confirmed.pk
        finally:
            # never leave the node full for the next tests
            for job_id in (j for j in (first, second) if j is not None):
                stack.api("POST", f"jobs/{job_id}/cancel")
                stack.drive(job_id, lambda job: stack.containers(job["id"]) == [], timeout=30)


def test_a_restarted_agent_reconciles_a_job_that_ran_on(stack):
    command = ["sh", "-c", "sleep 3; echo done > /outputs/done.txt; echo finished"]
    job_id = submitted(stack, "survivor", command)
    stack.drive(job_id, "running")
    stack.agent.kill()  # SIGKILL mid-job: the container runs on without its agent
    assert [c.status for c in stack.containers(job_id)] == ["running"]
    stack.agent.start()  # same state dir: its stored credential, no enrollment
    job = stack.drive(job_id, "succeeded", timeout=30)
    assert job["exit_code"] == 0 and job["attempts"] == 1
    download = stack.api("GET", f"jobs/{job_id}/outputs/done.txt")
    assert download.content == b"done\n"
    stack.drive(job_id, lambda job: stack.containers(job_id) == [], timeout=10)


def test_an_agent_gone_for_good_loses_its_jobs_and_the_retry_policy_requeues(stack):
    sleep = ["sleep", "300"]
    once = submitted(stack, "once", sleep, retry_policy={"max_attempts": 1})
    twice = submitted(
        stack, "twice", sleep, retry_policy={"max_attempts": 2, "retry_on": ["node_lost"]}
    )
    for job_id in (once, twice):
        stack.drive(job_id, "running")
    stack.agent.kill()
    try:
        # Rather than wait: the real sweeps with a `now` in the future.
        later = timezone.now() + timedelta(minutes=1)
        assert stack.node().pk in node_heartbeat_sweep(now=later)
        # A heartbeat the agent sent just before its kill may be served after that sweep (on a
        # loaded machine): the next sweep then finds the node silent again.
        for _ in range(20):
            if stack.node().reachability == "unreachable":
                break
            time.sleep(0.5)
            node_heartbeat_sweep(now=later)
        node = stack.node()
        assert node.reachability == "unreachable"
        assert lease_states(once) == lease_states(twice) == ["uncertain"]
        deadline = later + lease_tasks.UNCERTAIN_DEADLINE + timedelta(seconds=1)
        assert lease_tasks.expire_uncertain(now=deadline.isoformat()) == 2
        assert lease_states(once) == lease_states(twice) == ["expired"]
        moved = scheduling_tasks.requeue_stranded_jobs(now=deadline.isoformat())
        assert sorted(moved) == sorted([once, twice])

        lost = stack.job(once)
        assert lost["state"] == "lost" and stack.reasons(once)[-1] == "node_lost"
        retried = stack.job(twice)
        assert retried["state"] == "queued" and retried["attempts"] == 1
        event = stack.api("GET", f"jobs/{twice}/events").json()[-1]
        assert event["reason"] == "retry_scheduled" and event["data"]["failure"] == "node_lost"
        assert retried["not_before"]  # the policy's backoff (30 s from the sweep's now)
    finally:
        # The node's containers outlived their agent: remove them, then cancel the retried job
        # (it waits out its backoff) so that the next test finds the node empty.
        for container in stack.containers():
            container.remove(force=True)
        stack.api("POST", f"jobs/{twice}/cancel")
