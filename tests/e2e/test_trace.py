"""One trace per job end to end (docs/observability.md "Traces"), through the whole stack
(tests/e2e/conftest.py): a tenant submits over HTTP with its own W3C `traceparent`, the
scheduling pass places the job, the real agent pulls, starts and runs it in a container on the
real Docker engine and uploads its output; the trace endpoint then answers every step's span in
order, in the client's trace, each with its duration, each one starting where the one before
ended. Operators also see where each step ran; the tenant does not. The job page's timeline
in headless Chromium shows the same spans and durations."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

import pytest
import requests
from playwright.sync_api import expect

from config.builders import build_person, build_token
from pools.choices import PlatformRole
from tests.browser import chromium_page, sign_in

pytestmark = pytest.mark.docker

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
# the steps of a run that pulled its image and uploaded an output (jobs/trace.py STEPS)
STEPS = [
    "submit",
    "scheduling",
    "node_admission",
    "image_pull",
    "container_start",
    "running",
    "result_upload",
    "end",
]
OPERATOR = "e2e-trace-olga"


@pytest.fixture(scope="module")
def operator_token(stack, django_db_blocker):
    with django_db_blocker.unblock():
        build_person(OPERATOR, platform_role=PlatformRole.OPERATOR)
        return build_token(build_person(OPERATOR))


@pytest.fixture(scope="module")
def finished(stack, django_db_blocker) -> int:
    """A job submitted in the client's trace and run by the agent to success (one per module:
    the API test and the browser test read the same trace)."""
    with django_db_blocker.unblock():
        body = {
            "tenant": stack.tenant.slug,
            "pool": stack.pool.slug,
            "name": "traced",
            "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
            "image": "127.0.0.1:5000/computepool/busybox:test",
            "command": ["sh", "-c", "echo hi; echo hi > /outputs/a.txt"],
        }
        response = stack.api("POST", "jobs", json=body, headers={"traceparent": TRACEPARENT})
        assert response.status_code == 201, response.text
        assert response.json()["trace_id"] == CLIENT_TRACE
        job_id = response.json()["id"]
        stack.drive(job_id, "succeeded")
        return job_id


def trace_of(stack, job_id, token=None) -> dict:
    if token is None:
        response = stack.api("GET", f"jobs/{job_id}/trace")
    else:
        response = requests.get(
            f"{stack.url}/api/v1/jobs/{job_id}/trace",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    return response.json()


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_the_trace_of_a_job_run_by_the_agent_has_every_step_in_order(stack, finished):
    assert stack.reasons(finished) == [
        "submitted",
        "placed",
        "image_pulling",
        "image_pulled",
        "startup_began",
        "container_started",
        "results_uploaded",
        "exited_zero",
    ]
    body = trace_of(stack, finished)
    assert body["job"] == finished and body["trace_id"] == CLIENT_TRACE
    root, *steps = body["spans"]
    assert root["name"] == "job" and root["parent_span_id"] == CLIENT_SPAN
    assert root["status"] == "ok" and root["end_reason"] == "exited_zero"
    assert body["traceparent"] == f"00-{CLIENT_TRACE}-{root['span_id']}-01"
    assert [span["name"] for span in steps] == STEPS
    for span in steps:
        assert span["parent_span_id"] == root["span_id"], span
        assert span["end"] is not None and span["duration_s"] is not None, span
        assert span["duration_s"] >= 0, span
        assert (
            abs((at(span["end"]) - at(span["start"])).total_seconds() - span["duration_s"]) < 1e-3
        )
        assert span["status"] == "ok", span
        assert "attributes" not in span  # the tenant's view: nothing of the infrastructure
    assert all(span["attempt"] == 1 for span in steps[2:])
    for before, after in pairwise(steps):
        gap = abs((at(after["start"]) - at(before["end"])).total_seconds())
        assert gap <= 1, (before["name"], after["name"], gap)
    assert len({span["span_id"] for span in body["spans"]}) == len(body["spans"])
    # the whole trace lies within the job's own span
    assert at(root["start"]) <= at(steps[0]["start"])
    assert at(steps[-1]["end"]) <= at(root["end"])
    assert root["duration_s"] >= sum(span["duration_s"] for span in steps) - 1e-3


def test_operators_see_where_each_step_ran_and_the_tenant_does_not(stack, finished, operator_token):
    tenant = trace_of(stack, finished)
    operator = trace_of(stack, finished, operator_token)
    # the same spans for both, only operators see the attributes
    strip = [{k: v for k, v in span.items() if k != "attributes"} for span in operator["spans"]]
    assert strip == tenant["spans"]
    assert all("attributes" not in span for span in tenant["spans"])
    by_name = {span["name"]: span for span in operator["spans"]}
    node = stack.agent.node_name
    for name in ("scheduling", "node_admission", "image_pull", "container_start", "running"):
        attributes = by_name[name]["attributes"]
        assert attributes["node"] == node, (name, attributes)
        assert attributes["lease"] and attributes["policy_version"], (name, attributes)
    assert by_name["submit"]["attributes"] == {}  # before the decision: nowhere yet


# --- the console's trace timeline, in headless Chromium ----------------------------------------


def page_spans(page) -> list[tuple[str, str]]:
    rows = page.locator("#job-trace table.trace-table tbody tr")
    return rows.evaluate_all(
        "rows => rows.map(r => [r.dataset.span, r.querySelector('td.num').textContent.trim()])"
    )


@pytest.mark.browser
def test_the_job_page_draws_the_trace_timeline(stack, finished, console, operator_token):
    api_spans = trace_of(stack, finished)["spans"]
    names = [span["name"] for span in api_spans]
    for who, password, sees_where in (
        ("e2e-alice", "pw-e2e-alice", False),
        (OPERATOR, f"pw-{OPERATOR}", True),
    ):
        with chromium_page() as page:
            sign_in(page, console, who, password)
            page.goto(f"{console}/console/jobs/{finished}")
            section = page.locator("#job-trace")
            expect(section).to_contain_text(CLIENT_TRACE)
            bars = section.locator(".trace-chart .trace-row")
            expect(bars).to_have_count(len(api_spans))
            assert bars.evaluate_all("rows => rows.map(r => r.dataset.span)") == names
            # every bar is drawn (a visible width), in the span's status
            widths = section.locator(".trace-bar").evaluate_all(
                "bars => bars.map(b => b.getBoundingClientRect().width)"
            )
            assert len(widths) == len(api_spans) and all(width > 0 for width in widths)
            assert section.locator(".trace-bar.trace-ok").count() == len(api_spans)
            # the table: the same spans, the same durations (3 decimals)
            shown = page_spans(page)
            assert [name for name, _ in shown] == names
            for (_, text), span in zip(shown, api_spans, strict=True):
                assert abs(float(text) - span["duration_s"]) <= 0.0015, (text, span)
            headers = section.locator("table.trace-table thead th")
            if sees_where:
                expect(headers.last).to_have_text("Where")
                where = section.locator("tbody tr[data-span=running] td").last
                expect(where).to_contain_text(f"node {stack.agent.node_name}")
            else:
                expect(headers).to_have_count(5)
                expect(section).not_to_contain_text("Where")
                expect(section).not_to_contain_text(stack.agent.node_name)
