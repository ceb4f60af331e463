"""The agent's drain callback (scheduling/api/agent.py): only for a job on its own node."""

from datetime import timedelta

import pytest

from config.builders import SYSTEM
from jobs.choices import JobState
from nodes import services
from scheduling import drain
from tests.clients import bearer_client

pytestmark = pytest.mark.django_db


def test_agent_checkpointed_callback_checks_the_job_is_on_this_node(
    ready_node, enroll, private_pool, make_job, now
):
    node = ready_node.node
    mine, lease = make_job(node, checkpointable=True)
    theirs, _ = make_job(enroll(private_pool).node, checkpointable=True)
    services.node_drain(node=node, actor=SYSTEM, deadline=now + timedelta(seconds=1), now=now)
    drain.node_drain_sweep(now=now + timedelta(seconds=1))
    client = bearer_client(ready_node.secret)
    token = {"fencing_token": lease.fencing_token}
    assert client.post(f"/api/v1/agent/jobs/{theirs.pk}/checkpointed/", token).status_code == 403
    assert client.post("/api/v1/agent/jobs/999999/checkpointed/", token).status_code == 403
    assert client.post(f"/api/v1/agent/jobs/{mine.pk}/checkpointed/").status_code == 400
    stale = {"fencing_token": lease.fencing_token - 1}
    refused = client.post(f"/api/v1/agent/jobs/{mine.pk}/checkpointed/", stale)
    assert refused.status_code == 409 and refused.json()["code"] == "fencing_token_mismatch"
    done = client.post(f"/api/v1/agent/jobs/{mine.pk}/checkpointed/", token)
    assert done.status_code == 200 and done.json()["state"] == JobState.QUEUED
