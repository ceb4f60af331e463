"""One trace per job over the API: a client's `traceparent` joins, the trace endpoint and who
sees what, the agent's trace context, result upload and capacity_vanished as events."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from config import builders
from config.builders import SYSTEM, TEST_IMAGE_TAG, gpu_request, submit_job
from jobs import trace
from jobs.api import agent as agent_api
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from leases.choices import LeaseState
from nodes import services as node_services
from pools import logcontext
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def submit(client, **headers):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "shape": "cpu-small",
        "image": TEST_IMAGE_TAG,
        "command": ["echo", "hi"],
    }
    return client.post("/api/v1/jobs/", body, format="json", **headers)


def test_a_valid_traceparent_makes_the_job_join_the_clients_trace(api, member, cpu_shape):
    client = api(member)
    response = submit(client, HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 201, response.json()
    assert response.json()["trace_id"] == CLIENT_TRACE
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.trace_id, job.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    body = client.get(f"/api/v1/jobs/{job.pk}/trace").json()
    assert body["trace_id"] == CLIENT_TRACE
    root = body["spans"][0]
    assert root["name"] == "job" and root["parent_span_id"] == CLIENT_SPAN
    assert body["traceparent"] == f"00-{CLIENT_TRACE}-{root['span_id']}-01"
    assert client.get(f"/api/v1/jobs/{job.pk}").json()["trace_id"] == CLIENT_TRACE


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        f"ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",
        f"00-{CLIENT_TRACE}-{'0' * 16}-01",
        None,
    ],
)
def test_an_invalid_or_absent_traceparent_starts_a_new_trace(api, member, cpu_shape, header):
    headers = {"HTTP_TRACEPARENT": header} if header is not None else {}
    first = submit(api(member), **headers)
    second = submit(api(member), **headers)
    assert first.status_code == second.status_code == 201
    ids = {first.json()["trace_id"], second.json()["trace_id"]}
    assert len(ids) == 2 and CLIENT_TRACE not in ids
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) and set(i) != {"0"} for i in ids)
    assert Job.objects.get(pk=first.json()["id"]).parent_span_id == ""


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


def place(job):
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    job.refresh_from_db()
    return job, job.leases.get(state=LeaseState.RESERVED)


def report(api, job, lease, step, headers=None, **body):
    body = {"fencing_token": str(lease.fencing_token), "step": step, **body}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json", **(headers or {}))


def gpu_job(pool, tenant):
    return job_submit(
        tenant=tenant,
        pool=pool,
        name="gpu",
        image=builders.TEST_IMAGE,
        actor=SYSTEM,
        resources=gpu_request(count=1),
    )


def run_to_the_end(node_api, job, lease, **final):
    for step in ("pulling", "starting", "running"):
        assert report(node_api, job, lease, step).status_code == 200, step
    assert report(node_api, job, lease, "succeeded", **final).status_code == 200


def test_the_trace_endpoint_shows_tenants_the_steps_and_operators_also_where(
    agent, node_api, tenant, member, outsider, operator, api
):
    job, lease = place(gpu_job(agent.node.pool, tenant))
    run_to_the_end(node_api, job, lease, upload_seconds=0.5)
    mine = api(member).get(f"/api/v1/jobs/{job.pk}/trace")
    assert mine.status_code == 200
    spans = mine.json()["spans"]
    assert [s["name"] for s in spans] == [
        "job",
        "submit",
        "scheduling",
        "node_admission",
        "image_pull",
        "container_start",
        "running",
        "result_upload",
        "end",
    ]
    assert all(s["duration_s"] is not None and s["status"] == "ok" for s in spans)
    assert agent.node.name not in mine.content.decode()
    assert all("attributes" not in s for s in spans)
    theirs = api(operator).get(f"/api/v1/jobs/{job.pk}/trace").json()["spans"]
    admission = theirs[3]["attributes"]
    assert admission["node"] == agent.node.name and admission["lease"] == lease.pk
    uuids = set(agent.node.gpus.values_list("uuid", flat=True))
    assert len(admission["gpus"]) == 1 and set(admission["gpus"]) <= uuids
    assert "policy_version" in admission
    assert [s["span_id"] for s in theirs] == [s["span_id"] for s in spans]  # same ids
    assert api(outsider).get(f"/api/v1/jobs/{job.pk}/trace").status_code == 404
    assert bearer_client().get(f"/api/v1/jobs/{job.pk}/trace").status_code == 401


def test_the_assignment_carries_the_jobs_traceparent(agent, node_api, tenant):
    job, _ = place(submit_job(agent.node.pool, tenant))
    (entry,) = node_api.get("/api/v1/agent/assignments").json()
    assert entry["traceparent"] == trace.job_traceparent(job)
    assert trace.parse_traceparent(entry["traceparent"])[0] == job.trace_id


def test_a_report_about_a_job_binds_its_trace_id_and_a_strangers_traceparent_is_ignored(
    agent, node_api, tenant, monkeypatch
):
    job, lease = place(submit_job(agent.node.pool, tenant))
    seen = []
    original = agent_api.lifecycle.job_report

    def spy(**kwargs):
        seen.append(logcontext.trace_id.get())
        return original(**kwargs)

    monkeypatch.setattr(agent_api.lifecycle, "job_report", spy)
    own = {"HTTP_TRACEPARENT": trace.job_traceparent(job)}
    assert report(node_api, job, lease, "pulling", headers=own).status_code == 200
    stranger = {"HTTP_TRACEPARENT": TRACEPARENT}
    assert report(node_api, job, lease, "starting", headers=stranger).status_code == 200
    assert report(node_api, job, lease, "running").status_code == 200
    assert seen == [job.trace_id] * 3
    assert logcontext.trace_id.get() == ""  # unbound once the request is done


def test_the_final_report_writes_the_result_upload_as_an_event(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    for step in ("pulling", "starting", "running"):
        assert report(node_api, job, lease, step).status_code == 200, step
    before = timezone.now() - timedelta(seconds=10)
    job.events.update(at=before)  # the run began 10 s ago
    assert report(node_api, job, lease, "succeeded", upload_seconds=2.5).status_code == 200
    uploaded = job.events.get(reason=Reason.RESULTS_UPLOADED)
    end = job.events.get(reason=Reason.EXITED_ZERO)
    assert uploaded.data["upload_seconds"] == pytest.approx(2.5, abs=0.01)
    assert uploaded.data["files"] == 0 and uploaded.data["attempt"] == 1
    assert end.at - uploaded.at == pytest.approx(timedelta(seconds=2.5), abs=timedelta(seconds=0.5))
    # never before the job's previous event (the agent's clock is not trusted further)
    assert uploaded.at >= job.events.get(reason=Reason.CONTAINER_STARTED).at >= before
    assert uploaded.from_state == uploaded.to_state == JobState.RUNNING


def test_a_final_report_without_upload_time_or_outputs_writes_no_upload_event(
    agent, node_api, tenant
):
    job, lease = place(submit_job(agent.node.pool, tenant))
    run_to_the_end(node_api, job, lease)
    assert not job.events.filter(reason=Reason.RESULTS_UPLOADED).exists()


def test_upload_seconds_only_with_the_end(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    response = report(node_api, job, lease, "pulling", upload_seconds=1)
    assert response.status_code == 400 and "upload_seconds" in response.json()


# --- capacity_vanished ----------------------------------------------------------------------


def shrink(node, **changes):
    """The agent reports less than the node registered; the reconciliation sweep sees it."""
    node.refresh_from_db()
    inventory = {**node.inventory, **changes}
    inventory["gpus"] = [dict(g) for g in changes.get("gpus", node.inventory["gpus"])]
    node_services.node_inventory_report(node=node, inventory=inventory)
    node_services.node_inventory_reconcile(node=node, actor=SYSTEM)
    node.refresh_from_db()
    return node


def test_capacity_vanishing_under_a_running_job_fails_it_or_retries_by_policy(
    agent, node_api, tenant
):
    retried = submit_job(
        agent.node.pool,
        tenant,
        cpu=40000,
        retry_policy={"max_attempts": 2, "backoff_s": 0, "retry_on": ["capacity_vanished"]},
    )
    retried, lease = place(retried)
    for step in ("pulling", "starting", "running"):
        report(node_api, retried, lease, step)
    node = shrink(agent.node, cpu_millicores=8000)
    retried.refresh_from_db()
    lease.refresh_from_db()
    assert retried.state == JobState.QUEUED
    event = retried.events.latest("id")
    assert event.reason == Reason.CAPACITY_VANISHED and event.data["failure"] == "capacity_vanished"
    assert event.data["shortfall"]["cpu_millicores"] > 0
    assert lease.state == LeaseState.RELEASED
    # the node's ledger came down to what it has now, not what the lease held
    assert node.cpu_millicores_reserved == 0
    assert node.cpu_millicores_allocatable <= 8000
    # the trace's attempt ends in an error and a new scheduling span begins
    spans = trace.job_spans(retried, retried.events.order_by("at", "id"))
    assert [s.name for s in spans][-2:] == ["running", "scheduling"]
    assert spans[-2].status == "error" and spans[-2].end_reason == "capacity_vanished"


def test_capacity_vanishing_fails_a_running_job_its_policy_does_not_retry(agent, node_api, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant, cpu=40000))
    for step in ("pulling", "starting", "running"):
        report(node_api, job, lease, step)
    shrink(agent.node, cpu_millicores=8000)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.events.latest("id").reason == Reason.CAPACITY_VANISHED


def test_a_vanished_gpu_requeues_the_placed_job_that_holds_it_and_spares_the_others(agent, tenant):
    holder, lease = place(gpu_job(agent.node.pool, tenant))
    bystander, _ = place(submit_job(agent.node.pool, tenant, cpu=1000))
    held = lease.gpu_allocations[0]["gpu"]
    node = agent.node
    kept = [g for g in node.inventory["gpus"] if g["uuid"] != node.gpus.get(pk=held).uuid]
    shrink(node, gpus=kept)
    holder.refresh_from_db()
    bystander.refresh_from_db()
    assert holder.state == JobState.QUEUED  # not started: back to the queue
    assert holder.events.latest("id").reason == Reason.CAPACITY_VANISHED
    assert bystander.state == JobState.LEASED


def test_the_newest_placements_go_first_until_the_rest_fit():
    from jobs.receivers import vanished_under

    class L:
        def __init__(self, cpu, gpus=()):
            self.cpu_millicores, self.memory_mib, self.scratch_mib = cpu, 0, 0
            self.gpu_allocations = [{"gpu": g} for g in gpus]

    newest, middle, oldest = L(1000), L(3000), L(500, gpus=[9])
    leases = [newest, middle, oldest]
    assert vanished_under(leases, {"cpu_millicores": 3500}, []) == [newest, middle]
    assert vanished_under(leases, {"cpu_millicores": 500}, [9]) == [oldest]
    assert vanished_under(leases, {"cpu_millicores": 600}, [9]) == [oldest, newest]
    assert vanished_under(leases, {}, []) == []
