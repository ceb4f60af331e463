"""A checkpointed job's next attempt starts from its checkpoint (docs/data-plane.md,
"Checkpoints"): the assignment names it (`restore`), and only the node holding the job's current
lease may download it, through `GET /api/v1/agent/jobs/{id}/checkpoint`."""

import hashlib
import io
import tarfile
from datetime import timedelta

from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from config.builders import SYSTEM, submit_job
from nodes import services as node_services
from pools.actors import Actor
from scheduling.drain import node_drain_enforce
from tests.clients import bearer_client

from .test_agent_api import place, report, run


def a_checkpoint(state: bytes) -> bytes:
    """What the agent uploads: the files of $CHECKPOINT_DIR under checkpoint/."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo("checkpoint/state")
        entry.size = len(state)
        tar.addfile(entry, io.BytesIO(state))
    return buffer.getvalue()


def upload(api, job, lease, name, data):
    files = [SimpleUploadedFile(name, data)]
    body = {"fencing_token": str(lease.fencing_token), "files": files}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/outputs", body, format="multipart")


def download(api, job):
    return api.get(f"/api/v1/agent/jobs/{job.pk}/checkpoint")


def checkpointed_on_a_draining_node(agent, node_api, tenant, archive, **fields):
    """Attempt 1 runs on `agent`'s node, which is drained: it is asked for a checkpoint, uploads
    it and reports `checkpointed`; the job is queued again."""
    job, lease = place(submit_job(agent.node.pool, tenant, checkpointable=True, **fields))
    run(node_api, job, lease)
    now = timezone.now()
    node_services.node_drain(node=agent.node, actor=SYSTEM, deadline=now + timedelta(seconds=1))
    node_drain_enforce(node=agent.node, actor=SYSTEM, now=now + timedelta(seconds=2))
    assert upload(node_api, job, lease, "checkpoint.tar", archive).status_code == 201
    # the attempt's own checkpoint is not one to restore: the next attempt's is
    assert download(node_api, job).status_code == 404
    assert report(node_api, job, lease, "checkpointed").json()["state"] == "queued"
    return job


def test_a_first_attempt_has_nothing_to_restore(agent, tenant):
    node_api = bearer_client(agent.secret)
    job, _ = place(submit_job(agent.node.pool, tenant))
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert entry["restore"] is None
    response = download(node_api, job)
    assert response.status_code == 404


def test_the_next_attempt_restores_the_checkpoint_on_its_node_only(agent, enroll, tenant):
    node_api = bearer_client(agent.secret)
    archive = a_checkpoint(b"saved\n")
    job = checkpointed_on_a_draining_node(agent, node_api, tenant, archive)
    second = enroll(agent.node.pool)
    node_services.node_heartbeat(node=second.node, actor=Actor.for_node(second.node))
    second_api = bearer_client(second.secret)

    job, lease = place(job)

    assert lease.node_id == second.node.pk and job.attempts == 2
    [entry] = second_api.get("/api/v1/agent/assignments").json()
    assert entry["attempt"] == 2
    assert entry["restore"] == {
        "url": f"http://testserver/api/v1/agent/jobs/{job.pk}/checkpoint",
        "sha256": hashlib.sha256(archive).hexdigest(),
    }
    response = download(second_api, job)
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == archive
    assert response["X-Checksum-Sha256"] == hashlib.sha256(archive).hexdigest()
    # the node of the earlier attempt no longer holds the job: refused
    refused = download(node_api, job)
    assert refused.status_code == 403 and refused.json()["code"] == "outside_node_scope"


def test_a_node_that_never_held_the_job_may_not_download_its_checkpoint(agent, enroll, tenant):
    node_api = bearer_client(agent.secret)
    job = checkpointed_on_a_draining_node(agent, node_api, tenant, a_checkpoint(b"x"))
    stranger = enroll(agent.node.pool)
    response = download(bearer_client(stranger.secret), job)
    assert response.status_code == 403 and response.json()["code"] == "outside_node_scope"


def test_the_newest_earlier_checkpoint_is_restored(agent, enroll, tenant):
    """Attempt 2 ran from attempt 1's checkpoint and wrote a new one before it failed and was
    retried: attempt 3 restores attempt 2's."""
    node_api = bearer_client(agent.secret)
    retry = {"max_attempts": 3, "backoff_s": 0, "retry_on": ["exited_nonzero"]}
    job = checkpointed_on_a_draining_node(
        agent, node_api, tenant, a_checkpoint(b"one"), retry_policy=retry
    )
    second = enroll(agent.node.pool)
    node_services.node_heartbeat(node=second.node, actor=Actor.for_node(second.node))
    second_api = bearer_client(second.secret)
    job, lease = place(job)
    run(second_api, job, lease)
    newer = a_checkpoint(b"two")
    assert upload(second_api, job, lease, "checkpoint.tar", newer).status_code == 201
    failed = report(second_api, job, lease, "failed", reason="exited_nonzero", exit_code=1)
    assert failed.json()["state"] == "queued"

    job, lease = place(job, now=timezone.now() + timedelta(seconds=1))

    [entry] = second_api.get("/api/v1/agent/assignments").json()
    assert entry["attempt"] == 3
    assert entry["restore"]["sha256"] == hashlib.sha256(newer).hexdigest()
    assert b"".join(download(second_api, job).streaming_content) == newer
