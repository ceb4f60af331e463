"""Retention (jobs/artifacts.py `expire_artifacts`, the daily `jobs.expire_artifacts` task): the
outputs and logs of a job that ended more than its pool's `output_retention_days` ago are
deleted, files from the storage and rows, one job at a time; a job that cannot be cleared is
recorded and kept, and the others are cleared all the same."""

import io
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.builders import SYSTEM, build_pool, submit_job
from jobs import artifacts
from jobs.models import JobLogChunk, JobOutput
from jobs.services import job_cancel
from jobs.tasks import expire_artifacts as expire_task
from pools.reasons import Reason
from pools.services import policy_version_publish


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def ended_job(pool, tenant, name="train"):
    """A job with a log and one output file, then cancelled (ended now)."""
    job = submit_job(pool, tenant, name=name)
    artifacts.job_log_append(job=job, attempt=1, text="hello\n")
    artifacts.job_output_store(job=job, attempt=1, name="out.txt", fileobj=io.BytesIO(b"data"))
    return job_cancel(job=job, actor=SYSTEM)


def later(days):
    return timezone.now() + timedelta(days=days, minutes=1)


def kept(job) -> bool:
    return job.outputs.exists() and job.log_chunks.exists()


def set_retention(pool, days):
    policy_version_publish(
        policy=pool.scheduling_policy,
        weights=pool.scheduling_policy.current.weights,
        knobs={"output_retention_days": days},
        actor=SYSTEM,
    )


def test_outputs_and_logs_go_30_days_after_the_end(api, member, pool, tenant, media):
    job = ended_job(pool, tenant)
    path = media / job.outputs.get().file.name
    assert path.exists() and artifacts.output_open(job.outputs.get()).read() == b"data"
    running = submit_job(pool, tenant, name="still-queued")
    artifacts.job_log_append(job=running, attempt=1, text="working\n")

    assert artifacts.expire_artifacts(now=later(29)) == 0  # not yet
    assert kept(job) and path.exists()

    assert expire_task(now=later(30).isoformat()) == 1
    assert not path.exists() and not (media / f"outputs/{job.pk}").exists()
    assert not JobOutput.objects.filter(job=job).exists()
    assert not JobLogChunk.objects.filter(job=job).exists()
    assert running.log_chunks.exists()  # a job that has not ended keeps its log
    client = api(member)
    assert client.get(f"/api/v1/jobs/{job.pk}/outputs/").json() == []
    assert client.get(f"/api/v1/jobs/{job.pk}/outputs/out.txt").status_code == 404
    assert client.get(f"/api/v1/jobs/{job.pk}/logs").content == b""
    event = client.get(f"/api/v1/jobs/{job.pk}/events/").json()[-1]
    assert (event["from_state"], event["to_state"]) == ("cancelled", "cancelled")
    assert event["reason"] == Reason.ARTIFACTS_EXPIRED
    assert event["data"] == {"outputs": 1, "log_chunks": 1}
    assert artifacts.expire_artifacts(now=later(60)) == 0  # nothing left: no second event


def test_each_pool_keeps_them_as_long_as_its_policy_says(pool, tenant):
    short = build_pool("short")
    set_retention(short, 7)
    default_job, short_job = ended_job(pool, tenant), ended_job(short, tenant)
    assert artifacts.expire_artifacts(now=later(8)) == 1
    assert kept(default_job) and not kept(short_job)


@pytest.mark.parametrize("days", [0, 3651, "30", True, 1.5])
def test_the_retention_knob_is_bounded(pool, days):
    with pytest.raises(ValidationError) as refused:
        set_retention(pool, days)
    assert "output_retention_days" in str(refused.value)


def test_a_job_that_cannot_be_cleared_is_recorded_and_the_sweep_goes_on(pool, tenant, media):
    stuck, fine = ended_job(pool, tenant, "stuck"), ended_job(pool, tenant, "fine")
    # its file replaced by a folder with something inside: the storage cannot delete it
    path = media / stuck.outputs.get().file.name
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")

    assert artifacts.expire_artifacts(now=later(31)) == 1
    assert not kept(fine) and kept(stuck)  # its rows rolled back with the failed delete
    failure = stuck.events.order_by("-id").first()
    assert failure.reason == Reason.SWEEP_FAILED and failure.to_state == "cancelled"

    (path / "inside").unlink()  # fixed: the next sweep clears it
    assert artifacts.expire_artifacts(now=later(32)) == 1
    assert not kept(stuck) and not path.exists()
