"""The forecast of queued jobs: a queue class and a start window from velocity and capacity
coming free, written in one statement, gone once the job is not queued, never naming anything
of another tenant."""

import json
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from config.builders import (
    build_node,
    build_person,
    build_pool,
    build_tenant,
    cpu_request,
    submit_job,
)
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_transition
from leases import services
from pools.actors import Actor
from pools.choices import TenantRole
from pools.reasons import Reason
from scheduling import forecast, tasks

SYSTEM = Actor.system("test")
NOW = timezone.now().replace(second=0, microsecond=0)
KEYS = {"queue_class", "earliest", "latest"}


@pytest.fixture
def fpool(db):
    pool = build_pool("forecast", exact_capacity=True)
    build_node(pool, "n1", cpu=4000, memory=8192)
    return pool


def place(pool, job, at):
    """What a pass does for a job: a lease for it, and the job `leased` with reason placed."""
    services.lease_reserve(
        pool=pool,
        tenant=job.tenant,
        request=job.resources,
        actor=SYSTEM,
        duration=timedelta(hours=1),
        job=job,
        now=at,
    )
    job_transition(job=job, to=JobState.LEASED, actor=SYSTEM, reason=Reason.PLACED, now=at)


def seconds_from_now(stamp: str) -> float:
    return (datetime.fromisoformat(stamp) - NOW).total_seconds()


def test_a_queued_job_gets_a_class_and_a_window(fpool):
    other, mine = build_tenant("fother"), build_tenant("fmine")
    running = submit_job(fpool, other, "big", cpu=4000, memory=4096, max_runtime_s=600)
    place(fpool, running, NOW - timedelta(seconds=60))  # ends in 540 s, declared
    first = submit_job(fpool, mine, "first", cpu=2000, memory=1024, max_runtime_s=3600)
    second = submit_job(fpool, mine, "second", cpu=2000, memory=1024, max_runtime_s=300)
    never = submit_job(fpool, mine, "never", cpu=2000, memory=1024)
    Job.objects.filter(pk=never.pk).update(resources=cpu_request(8000, 1024))  # pool: 4000

    assert forecast.refresh(fpool.pk, NOW) == 3

    got = {job.pk: job.forecast for job in Job.objects.filter(tenant=mine)}
    for each in got.values():
        assert set(each) == KEYS
    assert got[first.pk]["queue_class"] == "standard"
    assert got[second.pk]["queue_class"] == "short"
    # capacity frees at 540 s (the other tenant's job: snapped down to now); one placement in
    # 15 min: the head's latest is 2 × 900 s = 30 min, the next one's 2 × 2 × 900 s = 1 h,
    # both snapped up to the coarse window's 1 h (#17)
    assert seconds_from_now(got[first.pk]["earliest"]) == 0
    assert seconds_from_now(got[first.pk]["latest"]) == 3600
    assert seconds_from_now(got[second.pk]["earliest"]) == 0
    assert seconds_from_now(got[second.pk]["latest"]) == 3600
    assert got[never.pk] == {"queue_class": "standard", "earliest": None, "latest": None}
    # nothing of the other tenant: three fields, a class and two timestamps (or unknown)
    for each in got.values():
        assert each["queue_class"] in {"short", "gpu", "long", "standard"}
        for bound in (each["earliest"], each["latest"]):
            assert bound is None or datetime.fromisoformat(bound).tzinfo is not None
    text = json.dumps(got)
    assert other.slug not in text and running.name not in text and "lease" not in text
    assert Job.objects.get(pk=running.pk).forecast == {}


def test_the_forecast_is_written_in_one_statement(fpool):
    tenant = build_tenant("fmany")
    for i in range(25):
        submit_job(fpool, tenant, f"j{i}", cpu=500, memory=512)
    with CaptureQueriesContext(connection) as queries:
        forecast.refresh(fpool.pk, NOW)
    writes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(writes) == 2  # all forecasts at once, and emptying those no longer queued
    assert Job.objects.filter(tenant=tenant).exclude(forecast={}).count() == 25


def test_the_portable_path_writes_what_the_recordset_writes(fpool, settings):
    """SQLite's path (`make run`): the same forecasts, and only the changed ones written."""
    tenant = build_tenant("fport")
    for i in range(5):
        submit_job(fpool, tenant, f"p{i}", cpu=500 + 100 * i, memory=512)
    forecast.refresh(fpool.pk, NOW)
    jobs = Job.objects.filter(tenant=tenant)
    written = dict(jobs.values_list("id", "forecast"))
    jobs.update(forecast={})
    settings.LEASE_PORTABLE_PATHS = True  # leases/backend.py: what a SQLite deployment runs
    forecast.refresh(fpool.pk, NOW)
    assert dict(jobs.values_list("id", "forecast")) == written
    with CaptureQueriesContext(connection) as queries:
        forecast.refresh(fpool.pk, NOW)
    writes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(writes) == 1  # nothing changed: only the emptying of jobs no longer queued


def test_the_task_refreshes_each_pool_once(fpool, monkeypatch):
    tenant = build_tenant("fonce")
    for i in range(3):
        submit_job(fpool, tenant, f"o{i}", cpu=500, memory=512)
    refreshed, refresh = [], forecast.refresh
    monkeypatch.setattr(
        forecast, "refresh", lambda pool_id, now: refreshed.append(pool_id) or refresh(pool_id, now)
    )
    assert tasks.forecast_refresh() == {fpool.pk: 3}
    assert refreshed == [fpool.pk]  # once, not once per queued job


def test_the_forecast_is_emptied_once_the_job_leaves_the_queue(fpool):
    tenant = build_tenant("fleave")
    job = submit_job(fpool, tenant, "leaves", cpu=1000, memory=512)
    forecast.refresh(fpool.pk, NOW)
    assert Job.objects.get(pk=job.pk).forecast["earliest"] is not None
    place(fpool, job, NOW)
    forecast.refresh(fpool.pk, NOW + timedelta(seconds=5))
    assert Job.objects.get(pk=job.pk).forecast == {}


def test_with_nothing_placed_lately_only_the_head_has_a_latest(fpool):
    tenant = build_tenant("fstill")
    head = submit_job(fpool, tenant, "head", cpu=1000, memory=512)
    behind = submit_job(fpool, tenant, "behind", cpu=1000, memory=512)
    forecast.refresh(fpool.pk, NOW)
    head.refresh_from_db()
    behind.refresh_from_db()
    assert head.forecast["earliest"] == head.forecast["latest"] == NOW.isoformat()
    assert behind.forecast["earliest"] == NOW.isoformat() and behind.forecast["latest"] is None


def test_the_api_shows_the_forecast_of_queued_jobs_only(fpool, api):
    tenant = build_tenant("fapi")
    person = build_person("fapi-member", tenant=tenant, role=TenantRole.MEMBER)
    queued = submit_job(fpool, tenant, "waits", cpu=1000, memory=512)
    placed = submit_job(fpool, tenant, "placed", cpu=1000, memory=512)
    forecast.refresh(fpool.pk, NOW)
    place(fpool, placed, NOW)  # its stored forecast lingers until the next refresh
    client = api(person)
    shown = client.get(f"/api/v1/jobs/{queued.pk}/").json()["forecast"]
    assert set(shown) == KEYS and shown["queue_class"] == "standard"
    assert client.get(f"/api/v1/jobs/{placed.pk}/").json()["forecast"] == {}
