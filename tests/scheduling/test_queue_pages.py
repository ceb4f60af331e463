"""The queue pages' reads (scheduling/queue_selectors.py) and pages: the pool's queue in the
order the next pass considers it, the head-of-line reservation the gate holds, a tenant's view
that tells nothing of other tenants' work but a count per class, the health conditions (idle
capacity with backlog, and for how long; oldest pending) and the queue depth over time."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from config.builders import (
    build_node,
    build_person,
    build_pool,
    build_priority_class,
    build_tenant,
    submit_job,
)
from jobs.models import Job
from leases.services import tenants_at_quota
from pools.choices import PlatformRole
from pools.models import Tenant
from scheduling import health, queue_selectors, tasks
from scheduling.models import CapacitySample
from scheduling.pass_steps import plan
from scheduling.pass_steps.outcomes import PassResult
from scheduling.pass_steps.window import queued_jobs
from scheduling.passes import scheduling_pass

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(db):
    """Pool "q" with one 8-core node: alice holds 6 cores; alice and bob queue jobs of two
    classes, some that fit only once alice's job ends."""
    pool = build_pool("q", exact_capacity=True)
    build_node(pool, "n1", cpu=8000, memory=16384)
    alice, bob = build_tenant("alice"), build_tenant("bob")
    Tenant.objects.filter(pk=bob.pk).update(fair_share_weight=2.0)
    high = build_priority_class("high", 100, max_wait_s=3600)
    batch = build_priority_class("batch", 0, max_wait_s=60)
    running = submit_job(pool, alice, "running", cpu=6000, memory=1024)
    assert scheduling_pass().placed == [running.pk]
    jobs = [
        submit_job(pool, alice, "a-big", cpu=8000, memory=1024, priority=high),
        submit_job(pool, bob, "b-secret-1", cpu=4000, memory=1024, priority=batch),
        submit_job(pool, alice, "a-small", cpu=1000, memory=512, priority=batch),
        submit_job(pool, bob, "b-secret-2", cpu=2000, memory=512, priority=high),
        submit_job(pool, bob, "b-secret-3", cpu=1000, memory=512),
        submit_job(pool, alice, "a-3", cpu=3000, memory=512, priority=batch),
    ]
    return {"pool": pool, "alice": alice, "bob": bob, "running": running, "jobs": jobs}


def next_pass_order(pool, now) -> list[int]:
    """What the next pass would consider, in its order: its window, read and ordered by the
    pass's own steps."""
    at_quota = set(tenants_at_quota(pool_id=pool.pk))
    limit = settings.SCHEDULER_PASS_MAX_JOBS
    ids = [pk for pk, _, _ in queued_jobs(pool_id=pool.pk, limit=limit, skip=at_quota, now=now)]
    return [job.pk for job in plan.read(pool, ids, now, PassResult()).jobs]


def test_the_queue_is_in_the_order_the_next_pass_considers(world):
    now = timezone.now() + timedelta(minutes=3)  # some aging
    queue = queue_selectors.pool_queue(world["pool"], now)
    considered = [e["id"] for e in queue["jobs"] if e["considered"]]
    assert considered == next_pass_order(world["pool"], now)
    assert len(considered) == len(world["jobs"]) == queue["considered"]
    assert [e["position"] for e in queue["jobs"]] == list(range(1, len(world["jobs"]) + 1))
    # after a pass, still equal (fair share moved: alice holds more)
    scheduling_pass(now=now)
    later = now + timedelta(seconds=30)
    queue = queue_selectors.pool_queue(world["pool"], later)
    assert [e["id"] for e in queue["jobs"] if e["considered"]] == next_pass_order(
        world["pool"], later
    )


def test_jobs_outside_the_window_come_after_with_why(world, settings):
    settings.SCHEDULER_PASS_MAX_JOBS = 2
    backoff = world["jobs"][2]
    Job.objects.filter(pk=backoff.pk).update(not_before=timezone.now() + timedelta(hours=1))
    queue = queue_selectors.pool_queue(world["pool"])
    entries = queue["jobs"]
    assert [e["considered"] for e in entries] == [True, True, False, False, False, False]
    by_id = {e["id"]: e for e in entries}
    assert by_id[backoff.pk]["not_considered"].startswith("retry backoff until")
    assert sum("window" in e["not_considered"] for e in entries) == 3


def test_the_gate_s_head_of_line_reservation_is_shown(world):
    scheduling_pass()
    queue = queue_selectors.pool_queue(world["pool"])
    big = world["jobs"][0]
    assert [h["id"] for h in queue["head"]] == [big.pk]  # 8 cores: waits for alice's 6
    ops = Client()
    ops.force_login(build_person("olga", platform_role=PlatformRole.OPERATOR))
    body = ops.get("/console/ops/queue?pool=q").content.decode()
    row = body.split(f'data-job="{big.pk}"')[1].split("</tr>")[0]
    assert "head of line" in row and 'class="head-of-line"' in body
    assert "the queue&#x27;s gate holds capacity for" in body or "gate holds capacity for" in body
    for job in Job.objects.filter(pool=world["pool"], state="queued"):
        assert f'data-job="{job.pk}"' in body
    assert "bob" in body  # operators see tenants


def test_a_tenant_sees_its_own_jobs_and_only_counts_of_others(world):
    scheduling_pass()
    alice_person = build_person("al", tenant=world["alice"])
    client = Client()
    client.force_login(alice_person)
    response = client.get("/console/queue?pool=q")
    assert response.status_code == 200
    body = response.content.decode()
    view = response.context["q"]
    own = {j.pk for j in world["jobs"] if j.tenant_id == world["alice"].pk}
    assert {e["id"] for e in view["jobs"]} == own
    theirs = [j for j in world["jobs"] if j.tenant_id == world["bob"].pk]
    queued_theirs = Job.objects.filter(pool=world["pool"], tenant=world["bob"], state="queued")
    counts = {}
    for job in queued_theirs.select_related("priority_class"):
        name = job.priority_class.name if job.priority_class else "no class"
        counts[name] = counts.get(name, 0) + 1
    assert view["others"] == counts and sum(counts.values()) >= 2
    for job in theirs:
        assert f'data-job="{job.pk}"' not in body
        assert job.name not in body
        assert f"/console/jobs/{job.pk}" not in body
    assert "bob" not in body
    # positions are the whole queue's
    whole = {e["id"]: e["position"] for e in queue_selectors.pool_queue(world["pool"])["jobs"]}
    assert [e["position"] for e in view["jobs"]] == sorted(whole[pk] for pk in own)
    # the reservation is alice's own job: named to her
    assert f'href="/console/jobs/{world["jobs"][0].pk}"' in body
    bob_person = build_person("bo", tenant=world["bob"])
    client.force_login(bob_person)
    body = client.get("/console/queue?pool=q").content.decode()
    assert "another tenant" in body and "a-big" not in body and "alice" not in body
    assert Client().get("/console/queue").status_code == 302


def test_idle_capacity_with_backlog_shows_and_since_when(db):
    pool = build_pool("lab", exact_capacity=True)
    build_node(pool, "lab-1", cpu=4000, memory=8192)
    tenant = build_tenant("t")
    # a job no pass has placed (a stuck pass, as in the demo): the node idles beside it
    never = submit_job(pool, tenant, "stuck", cpu=2000, memory=1024)
    now = timezone.now()
    for minutes in (20, 17, 10, 1):  # samples: the node idle and the job queued for 17 min
        tasks_now = now - timedelta(minutes=minutes)
        health.sample_capacity(now=tasks_now)
        queue_selectors.record_queue_depth(tasks_now)
    first = CapacitySample.objects.filter(pool=pool).order_by("at").first()
    CapacitySample.objects.filter(pk=first.pk).update(queued={"quota_exceeded": 1})
    ops = Client()
    ops.force_login(build_person("olga", platform_role=PlatformRole.OPERATOR))
    response = ops.get("/console/ops/queue?pool=lab")
    health_now = response.context["health"]
    assert health_now["idle"]["backlog"] == 1
    assert health_now["idle_since"] == now - timedelta(minutes=17)
    assert health_now["idle_firing"]
    body = response.content.decode()
    assert "Idle capacity with backlog (alert firing)" in body
    assert "for 17 min" in body
    assert [d["queued"] for d in response.context["depth"]] == [1, 1, 1, 1]
    # the depth chart: axes with times and units, a value per point on hover or focus, a table
    chart = body[
        body.index('id="depth-chart"') : body.index("</figure>", body.index('id="depth-chart"'))
    ]
    assert chart.count('class="ts-point') == 4 and chart.count("<polyline") == 2
    assert 'class="tick tick-y"' in chart and "5 jobs</text>" in chart
    assert chart.count('class="tick tick-x"') >= 2
    first = timezone.localtime(now - timedelta(minutes=20)).strftime("%Y-%m-%d %H:%M")
    assert f'data-label="{first}: Queued 1 jobs, Waiting for capacity 0 jobs"' in chart
    assert "Queued jobs as a table" in chart and "<table>" in chart
    assert "js/charts.js" in body
    assert f'data-job="{never.pk}"' in body


def test_the_sample_task_records_the_queue_depth(world):
    tasks.sample_capacity()
    sample = CapacitySample.objects.get(pool=world["pool"])
    assert sum(sample.queued.values()) == len(world["jobs"])
    depth = queue_selectors.queue_depth(world["pool"])
    assert depth[-1]["queued"] == len(world["jobs"])


def test_oldest_pending_past_max_wait(world):
    Job.objects.filter(pk=world["jobs"][1].pk).update(
        state_changed_at=timezone.now() - timedelta(minutes=5)
    )
    ops = Client()
    ops.force_login(build_person("olga", platform_role=PlatformRole.OPERATOR))
    response = ops.get("/console/ops/queue?pool=q")
    late = response.context["health"]["late"]
    assert [(x["priority_class"], x["max_wait_s"]) for x in late] == [("batch", 60)]
    assert "<strong>late</strong>" in response.content.decode()
