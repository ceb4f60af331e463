"""Metrics end to end (docs/observability.md, "Metrics"): jobs run by the real agent on the
real Docker engine move the counters and histograms /metrics serves over HTTP: the queue wait
observed once per job, each exit counted with its reason, both startup phases observed."""

from __future__ import annotations

import re

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from config.builders import build_person, build_token
from observability.fold import fold
from pools.choices import PlatformRole

pytestmark = pytest.mark.docker


def scrape(stack, token) -> dict:
    response = requests.get(
        f"{stack.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_jobs_run_by_the_agent_move_the_metrics(stack):
    operator = build_person("e2e-olga", platform_role=PlatformRole.OPERATOR)
    token = build_token(operator, scopes=["metrics:read"])
    pool, tenant = stack.pool.slug, stack.tenant.slug
    fold()
    before = scrape(stack, token)
    jobs = []
    for name, command in (("fine", ["sh", "-c", "true"]), ("broken", ["sh", "-c", "exit 3"])):
        response = stack.submit(name, command)
        assert response.status_code == 201, response.text
        jobs.append(response.json()["id"])
    for job_id in jobs:
        stack.drive(job_id, lambda job: job["state"] in ("succeeded", "failed"))
    fold()
    after = scrape(stack, token)

    def moved(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("computepool_job_queue_wait_seconds_count", pool=pool, tenant=tenant) == 2
    assert moved("computepool_job_exits_total", pool=pool, reason="exited_zero") == 1
    assert moved("computepool_job_exits_total", pool=pool, reason="exited_nonzero") == 1
    for phase in ("image_pull", "container_start"):
        assert moved("computepool_job_startup_seconds_count", pool=pool, phase=phase) == 2
    assert moved("computepool_job_startup_seconds_sum", pool=pool, phase="container_start") > 0
    for outcome in ("succeeded", "failed"):
        assert moved("computepool_job_runtime_seconds_count", pool=pool, outcome=outcome) == 1
    assert moved("computepool_scheduling_attempts_total", pool=pool, result="placed") == 2
    # the live server's own requests, timed by URL pattern (never by path: no job id in a label)
    routes = {
        dict(labels)["route"] for name, labels in after if name.startswith("computepool_http")
    }
    assert r"api/v1/agent/jobs/(?P<job_id>\d+)/report/?$" in routes
    assert not any(re.search(rf"/{jobs[0]}(/|$)", route) for route in routes)
