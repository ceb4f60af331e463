"""Issue 17: a job cannot hide its own log lines. One NUL byte in what a job prints used to
make the agent's whole 2-second chunk a 400 `parse_error` (the API's parser refuses NUL, which
PostgreSQL text cannot hold), so every line around it was lost. The log callback now stores NUL
as U+FFFD and keeps the rest of the chunk. On the real engine: a container prints the NUL, the
agent's Docker runtime follows its output, the chunk goes through the agent API."""

import pytest

from jobs.models import JobLogChunk
from tests.clients import bearer_client

from .dataplane import Run, assignment_of, placed

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

PRINTS_NUL = ["sh", "-c", "echo before; printf 'in\\000side\\n'; echo after"]


def post_log(agent, job, text: str):
    lease = job.leases.get()
    body = {"fencing_token": str(lease.fencing_token), "text": text}
    return bearer_client(agent.secret).post(
        f"/api/v1/agent/jobs/{job.pk}/logs", body, format="json"
    )


def test_a_nul_the_job_prints_is_kept_as_u_fffd_with_the_rest_of_the_chunk(
    agent, tenant, docker_client, tmp_path, api, member
):
    job = placed(agent.node.pool, tenant, PRINTS_NUL)
    run = Run(docker_client, agent.node, assignment_of(agent.secret, job), tmp_path)
    try:
        run.create()
        printed = run.to_end()
    finally:
        run.remove()
    assert printed == "before\nin\x00side\nafter\n"  # the engine hands the NUL over as it is

    response = post_log(agent, job, printed)

    assert response.status_code == 200, response.content
    assert list(JobLogChunk.objects.filter(job=job).values_list("text", flat=True)) == [
        "before\nin\ufffdside\nafter\n"
    ]
    tail = api(member).get(f"/api/v1/jobs/{job.pk}/logs")
    assert tail.status_code == 200
    assert tail.content.decode() == "before\nin\ufffdside\nafter\n"


def test_lone_surrogates_in_a_chunk_are_replaced_too_and_nothing_else_changes(agent, tenant):
    job = placed(agent.node.pool, tenant, ["true"])
    token = job.leases.get().fencing_token
    text = r'"a\ud800b\u0000c\n"'  # JSON escapes: a lone surrogate and a NUL
    body = f'{{"fencing_token": "{token}", "text": {text}}}'
    response = bearer_client(agent.secret).post(
        f"/api/v1/agent/jobs/{job.pk}/logs", body, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert JobLogChunk.objects.get(job=job).text == "a\ufffdb\ufffdc\n"


def test_other_agent_bodies_still_refuse_nul(agent, tenant):
    """Only the log callback carries what a program printed; a report is still a 400."""
    job = placed(agent.node.pool, tenant, ["true"])
    lease = job.leases.get()
    body = {"fencing_token": str(lease.fencing_token), "step": "pulling", "reason": "x\x00"}
    response = bearer_client(agent.secret).post(
        f"/api/v1/agent/jobs/{job.pk}/report", body, format="json"
    )
    assert response.status_code == 400 and response.json()["code"] == "parse_error"
