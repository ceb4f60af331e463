"""What the data-plane attacks share: a job submitted and placed through the real services, its
assignment as the agent API hands it to the node, and that assignment run by the agent's real
Docker runtime on the real engine (the container's output followed as the agent follows it)."""

from __future__ import annotations

import os

from config.builders import submit_job
from jobs.models import Job
from leases.choices import LeaseState
from nodes.selectors import control_plane_id
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client
from worker_agent.runtime import disks
from worker_agent.runtime.base import Assignment, Owner
from worker_agent.runtime.docker import DockerRuntime


def placed(pool, tenant, command, **fields) -> Job:
    """A job submitted and placed by the scheduling pass (its lease reserved on the node)."""
    job = submit_job(pool, tenant, command=command, **fields)
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    job.refresh_from_db()
    assert job.leases.filter(state=LeaseState.RESERVED).exists()
    return job


def assignment_of(node_secret: str, job: Job) -> dict:
    """The job's entry of GET /agent/assignments, as the node's agent receives it."""
    response = bearer_client(node_secret).get("/api/v1/agent/assignments")
    assert response.status_code == 200, response.content
    [entry] = [entry for entry in response.json() if entry["job"] == job.pk]
    return entry


class Run:
    """One assignment through the Docker runtime: create, inspect, start, follow, remove."""

    def __init__(self, docker_client, node, entry: dict, workdir):
        self.assignment = Assignment.parse(entry)
        owner = Owner(control_plane_id(), node.pk, node.name)
        self.runtime = DockerRuntime(owner, client=docker_client)
        self.workdir = workdir
        for name in ("outputs", "inputs", "outputs/checkpoint"):
            (workdir / name).mkdir(parents=True, exist_ok=True)
            os.chmod(workdir / name, 0o777)
        self.container = None

    def create(self):
        self.runtime.pull(self.assignment)
        self.container = self.runtime.create(self.assignment, self.workdir)
        return self.container

    def to_end(self, timeout: float = 30) -> str:
        """Starts the container, waits for its end; what it printed (stdout and stderr)."""
        self.runtime.start(self.container)
        follower = self.runtime.logs(self.container)
        ended = self.runtime.wait(self.container, timeout)
        assert ended is not None, "the container did not end"
        follower.join(5)
        self.ended = ended
        return follower.take()

    def remove(self):
        if self.container is not None:
            self.runtime.remove(self.container)
        disks.release(self.workdir)  # its /outputs filesystem, as the runner does
