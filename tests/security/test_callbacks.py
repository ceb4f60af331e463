"""Issue 17: a node's callbacks for a job stop with its lease. Log, output and report callbacks
are refused 409 `lease_ended` once the agent's final report under the lease is in, or once the
pool's `stop_grace_s` + 30 s have passed since the lease ended; before that the last log lines
and files still arrive. A heartbeat naming an ended lease is never refused: that entry is
ignored. Before, a node credential could add outputs to a finished job at any time."""

from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from config.builders import SYSTEM, submit_job
from jobs.services import job_cancel
from leases.choices import LeaseState
from leases.models import Lease
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client

GRACE_AND_MARGIN = timedelta(seconds=10 + 30)  # the pool's default stop grace + 30 s


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


def placed(agent, tenant):
    job = submit_job(agent.node.pool, tenant)
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    return job, job.leases.get()


def report(api, job, lease, step, **body):
    body = {"fencing_token": str(lease.fencing_token), "step": step, **body}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")


def log(api, job, lease, text="line\n"):
    body = {"fencing_token": str(lease.fencing_token), "text": text}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/logs", body, format="json")


def upload(api, job, lease, name="late.txt"):
    files = [SimpleUploadedFile(name, b"written after the end\n")]
    body = {"fencing_token": str(lease.fencing_token), "files": files}
    return api.post(f"/api/v1/agent/jobs/{job.pk}/outputs", body)


def refused(response) -> bool:
    return response.status_code == 409 and response.json()["code"] == "lease_ended"


def test_after_the_agents_final_report_nothing_more_is_taken(agent, node_api, tenant):
    """The attack: a finished job's outputs and log grown afterwards with the node's credential."""
    job, lease = placed(agent, tenant)
    for step in ("pulling", "starting", "running"):
        assert report(node_api, job, lease, step).status_code == 200
    assert log(node_api, job, lease, "the last line\n").status_code == 200
    assert upload(node_api, job, lease, "result.txt").status_code == 201
    assert report(node_api, job, lease, "succeeded").status_code == 200
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED and lease.final_report_at is not None

    assert refused(upload(node_api, job, lease))
    assert refused(log(node_api, job, lease, "forged\n"))
    assert refused(report(node_api, job, lease, "failed", reason="runtime_error"))
    assert list(job.outputs.values_list("name", flat=True)) == ["result.txt"]
    assert "".join(job.log_chunks.values_list("text", flat=True)) == "the last line\n"


def test_before_the_deadline_the_last_lines_and_files_arrive_then_none(agent, node_api, tenant):
    """A lease the control plane ended (the job cancelled before it started: no final report):
    the node's last callbacks are taken until stop_grace_s + 30 s after the end."""
    job, lease = placed(agent, tenant)
    job_cancel(job=job, actor=SYSTEM)
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED and lease.final_report_at is None
    assert log(node_api, job, lease).status_code == 200
    assert upload(node_api, job, lease).status_code == 201
    # a report is never taken under an ended lease
    assert refused(report(node_api, job, lease, "starting"))

    almost = timezone.now() - GRACE_AND_MARGIN + timedelta(seconds=5)
    Lease.objects.filter(pk=lease.pk).update(ended_at=almost)
    assert log(node_api, job, lease).status_code == 200
    Lease.objects.filter(pk=lease.pk).update(ended_at=almost - timedelta(seconds=10))
    assert refused(log(node_api, job, lease))
    assert refused(upload(node_api, job, lease, "later.txt"))
    assert list(job.outputs.values_list("name", flat=True)) == ["late.txt"]


def test_a_heartbeat_naming_an_ended_lease_is_taken_and_that_entry_ignored(agent, node_api, tenant):
    job, lease = placed(agent, tenant)
    for step in ("pulling", "starting", "running"):
        assert report(node_api, job, lease, step).status_code == 200
    assert report(node_api, job, lease, "succeeded").status_code == 200
    lease.refresh_from_db()
    workload = {"lease": lease.pk, "job": job.pk, "state": "running"}
    workload["usage"] = {"cpu_millicores": 100, "memory_mib": 10}
    response = node_api.post("/api/v1/agent/heartbeat/", {"workloads": [workload]}, format="json")
    assert response.status_code == 200, response.content
    ended = Lease.objects.get(pk=lease.pk)
    assert ended.state == LeaseState.RELEASED
    assert ended.expires_at == lease.expires_at  # not renewed
    assert ended.usage_samples == 0 and ended.usage_reported_at is None  # not recorded
