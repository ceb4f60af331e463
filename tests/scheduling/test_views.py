"""The operators' pages under /console/ops/: capacity by pool, shape class and zone; queue and
fairness per tenant; a placement's decision record; scheduler health; a node's leases."""

import re

import pytest
from django.test import Client
from django.utils import timezone

from config.builders import build_node, build_person, build_pool, build_tenant, submit_job
from jobs.models import Job
from leases.models import Lease
from pools.choices import PlatformRole
from pools.models import Tenant
from scheduling import health
from scheduling.models import PassRecord
from scheduling.passes import scheduling_pass

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(db):
    client = Client()
    client.force_login(build_person("opal", platform_role=PlatformRole.OPERATOR))
    return client


@pytest.fixture
def world(db):
    """A pool with a CPU node in z1 and a GPU node in z2 (8 cores each); tenant "big" (weight 1)
    holds 6 cores on each, tenant "small" (weight 3) waits with a job of 4 cores."""
    pool = build_pool("ops", exact_capacity=True)
    cpu_node = build_node(pool, "cpu-1", cpu=8000, memory=16384, zone="z1")
    gpu_node = build_node(pool, "gpu-1", cpu=8000, memory=16384, zone="z2", gpus=[{}, {}])
    big, small = build_tenant("big"), build_tenant("small")
    Tenant.objects.filter(pk=small.pk).update(fair_share_weight=3.0)
    placed = submit_job(pool, big, "placed", cpu=6000, memory=4096)
    second = submit_job(pool, big, "second", cpu=6000, memory=4096)
    assert scheduling_pass().placed == [placed.pk, second.pk]
    waiting = submit_job(pool, small, "waits", cpu=4000, memory=1024)
    assert waiting.pk in scheduling_pass().pending
    return {"pool": pool, "cpu": cpu_node, "gpu": gpu_node, "placed": placed, "waiting": waiting}


OPS_URLS = ("/console/ops/capacity", "/console/ops/queue", "/console/ops/health")


def test_operators_only(world, ops):
    lease = Lease.objects.get(job=world["placed"])
    member = Client()
    member.force_login(build_person("mia", tenant=Tenant.objects.get(slug="big")))
    urls = (
        *OPS_URLS,
        f"/console/ops/leases/{lease.pk}/decision",
        f"/console/ops/jobs/{world['waiting'].pk}/decision",
        f"/console/ops/nodes/{world['cpu'].pk}/leases",
    )
    for url in urls:
        assert Client().get(url).status_code == 302  # to the login page
        assert member.get(url).status_code == 403  # even for their own tenant's lease
        assert ops.get(url).status_code == 200, url
        assert ops.post(url).status_code == 405
    assert ops.get("/console/ops/").status_code == 302
    assert ops.get("/console/ops/leases/999999/decision").status_code == 404


def cells(body: str, key: str) -> list[str]:
    """The text cells of the table row whose data-group is `key`."""
    row = body.split(f'data-group="{key}"')[1].split("</tr>")[0]
    return re.findall(r'<td data-label="[^"]+">([^<]*)</td>', row)


def test_capacity_by_pool_shape_class_and_zone(world, ops):
    body = ops.get("/console/ops/capacity?dim=cpu_millicores").content.decode()
    # nodes, allocatable, schedulable, used, free, fragmented, draining, unhealthy, unreachable
    # (reserved and unavailable are checked apart)
    assert cells(body, "ops") == ["2", "16000", "16000", "0", "4000", "0", "0", "0", "0"]
    assert "12000 <small>(75%)</small>" in body.split('data-group="ops"')[1]
    assert cells(body, "z2") == ["1", "8000", "8000", "0", "2000", "0", "0", "0", "0"]
    assert cells(body, "CPU only")[:3] == ["1", "8000", "8000"]
    gpu_class = "2 × NVIDIA H100 80GB HBM3, exclusive"
    assert cells(body, gpu_class)[:2] == ["1", "8000"]
    gpus = ops.get("/console/ops/capacity").content.decode()  # the fleet has GPUs: by default
    assert cells(gpus, gpu_class)[:2] == ["1", "2000"]
    assert 'class="seg-reserved"' in body and 'role="img"' in body


def test_capacity_defaults_to_cpu_on_a_cpu_only_fleet(ops):
    build_node(build_pool("cpus"), "c1", cpu=4000, memory=8192)
    body = ops.get("/console/ops/capacity").content.decode()
    assert '<option value="cpu_millicores" selected>' in body


def test_unavailable_capacity_is_its_own_grey_column(world, ops):
    from nodes.choices import Reachability
    from nodes.models import Node

    Node.objects.filter(pk=world["cpu"].pk).update(reachability=Reachability.UNREACHABLE)
    body = ops.get("/console/ops/capacity?dim=cpu_millicores").content.decode()
    row = cells(body, "ops")
    # schedulable 8000 of 16000; the unreachable node's 8000 is unavailable, and never free
    assert row[:3] == ["2", "16000", "8000"] and row[4] == "2000"
    assert '<td data-label="Unavailable" class="unavailable">8000</td>' in body
    assert row[-1] == "8000"  # unreachable
    assert 'class="seg-unavailable"' in body


def test_capacity_utilisation_over_time(world, ops):
    health.sample_capacity()
    body = ops.get("/console/ops/capacity?dim=cpu_millicores").content.decode()
    assert "utilisation of ops</strong>: requested peak 75%, average 75%" in body
    assert "<polyline" in body
    # axes with units and times, a labelled point per minute, a table fallback
    assert '<text x="42" y="10.0" class="tick tick-y" text-anchor="end"' in body
    assert ">100%</text>" in body and ">0%</text>" in body
    minute = timezone.localtime(timezone.now()).strftime("%H:%M")
    assert re.search(r'aria-label="\d{4}-\d\d-\d\d \d\d:\d\d: Requested 75%, Measured 0%"', body)
    assert body.count('class="ts-point') == 60 and minute in body
    assert "as a table</summary>" in body
    # the ranges, each a link; auto-refreshed by htmx
    for key in ("15m", "1h", "6h", "24h", "7d"):
        assert f'href="?dim=cpu_millicores&amp;range={key}"' in body
    assert 'hx-trigger="every 30s' in body
    six = ops.get("/console/ops/capacity?dim=cpu_millicores&range=6h").content.decode()
    assert six.count('class="ts-point') == 72 and 'data-range="6h" aria-current="true"' in six
    part = ops.get(
        "/console/ops/capacity?dim=cpu_millicores&range=15m&part=trends", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert part.startswith("{#") is False and 'id="trends"' in part and "<h1>" not in part
    assert part.count('class="ts-point') == 15
    health.roll_up()
    week = ops.get("/console/ops/capacity?dim=cpu_millicores&range=7d").content.decode()
    assert week.count('class="ts-point') == 168 and "requested peak 75%" in week


def test_capacity_bad_parameters_are_a_400(ops):
    assert ops.get("/console/ops/capacity?dim=bananas").status_code == 400
    assert ops.get("/console/ops/capacity?hours=7").status_code == 400
    assert ops.get("/console/ops/capacity?range=2h").status_code == 400
    assert ops.get("/console/ops/health?hours=0").status_code == 400
    assert ops.get("/console/ops/health?range=30d").status_code == 400
    assert ops.get("/console/ops/queue?pool=nowhere").status_code == 404


def test_queue_and_fairness_per_tenant(world, ops):
    body = ops.get("/console/ops/queue?pool=ops").content.decode()
    big = body.split('data-tenant="big"')[1].split("</tr>")[0]
    small = body.split('data-tenant="small"')[1].split("</tr>")[0]
    # big holds 12000 of 16000 millicores: a 75% dominant share against 1/(1+3) = 25%
    assert '<td data-label="Share">75%</td>' in big
    assert "25% (1.0)" in big and "over its entitlement" in big
    assert '<td data-label="Share">0%</td>' in small and "75% (3.0)" in small
    assert "under its entitlement" in small
    reason = Job.objects.get(pk=world["waiting"].pk).pending_reason["code"]
    assert f"<code>{reason}</code> 1" in small and "none" in big
    assert body.index('data-tenant="big"') < body.index('data-tenant="small"')


def test_decision_page_shows_the_pass_record(world, ops):
    lease = Lease.objects.get(job=world["placed"])
    decision = lease.placement["decision"]
    response = ops.get(f"/console/ops/jobs/{world['placed'].pk}/decision")
    assert response.status_code == 302  # a job's decision is its latest lease's
    body = ops.get(response.url).content.decode()
    assert f"version {decision['policy_version']}" in body
    assert f"{decision['nodes']} node(s) considered" in body
    assert f"{decision['chosen']} (chosen)" in body
    for term in decision["candidates"][0]["breakdown"]:
        assert f'<th scope="col">{term}</th>' in body
    assert "Chosen node's score breakdown" in body and "Grants" in body


def test_decision_of_a_waiting_job_says_why(world, ops):
    body = ops.get(f"/console/ops/jobs/{world['waiting'].pk}/decision").content.decode()
    code = Job.objects.get(pk=world["waiting"].pk).pending_reason["code"]
    assert "no placement yet" in body and f"<code>{code}</code>" in body


def test_scheduler_health_page(world, ops):
    # the world's own two scheduling passes recorded themselves (2 placed, then 1 waiting);
    # the page below counts two made-up ones
    recorded = PassRecord.objects.filter(pool=world["pool"]).order_by("started_at")
    assert [(r.considered, r.placed) for r in recorded] == [(2, 2), (1, 0)]
    assert all(0 < r.plan_s < r.duration_s for r in recorded)  # batch plans, timed by phase
    PassRecord.objects.all().delete()
    now = timezone.now()
    health.record_pass(pool_id=world["pool"].pk, started_at=now, duration_s=0.4, placed=7)
    health.record_pass(pool_id=world["pool"].pk, started_at=now, duration_s=0.2, conflicts=2)
    body = ops.get("/console/ops/health?pool=ops").content.decode()
    assert "2 passes placed 7 jobs; 0 leases expired." in body
    assert "Batch plan, mean seconds" not in body  # no pass of the window was timed by phase
    assert "Pass duration (max)</strong>: last 0.4 s, peak 0.4 s" in body
    assert "Placements per pass</strong>: last 3.5" in body
    assert "Plan conflicts</strong>: last 2," in body
    assert body.count("<polyline") == 7 and body.count('class="ts-point') == 7 * 60
    assert ">0.5 s</text>" in body  # the y axis: a round top over the peak, in seconds
    assert ops.get("/console/ops/health?pool=ops&hours=24").status_code == 200
    for key, points in (("15m", 15), ("6h", 72), ("24h", 96), ("7d", 168)):
        page = ops.get(f"/console/ops/health?pool=ops&range={key}").content.decode()
        assert page.count('class="ts-point') == 7 * points, key
    part = ops.get(
        "/console/ops/health?pool=ops&range=15m&part=charts", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'id="health-charts"' in part and "<h1>" not in part
    phases = {"snapshot_s": 0.01, "plan_s": 0.1, "apply_s": 0.05}
    health.record_pass(pool_id=world["pool"].pk, started_at=now, duration_s=0.3, **phases)
    body = ops.get("/console/ops/health?pool=ops").content.decode()
    assert "Batch plan, mean seconds per pass: snapshot 0.010, plan 0.100, apply 0.050." in body


def test_node_leases_fragment(world, ops):
    lease = Lease.objects.get(job=world["placed"])
    body = ops.get(f"/console/ops/nodes/{lease.node_id}/leases").content.decode()
    assert f'data-lease="{lease.pk}"' in body and "placed" in body
    assert f"/console/ops/leases/{lease.pk}/decision" in body
    empty = build_node(world["pool"], "spare")
    assert "No leases." in ops.get(f"/console/ops/nodes/{empty.pk}/leases").content.decode()


def test_node_usage_graphs_and_drain_progress(world, ops):
    from datetime import timedelta

    from nodes import services as node_services
    from pools.actors import Actor

    node = world["cpu"]
    health.sample_capacity()
    body = ops.get(f"/console/ops/nodes/{node.pk}/usage?range=15m").content.decode()
    assert "CPU (m)</strong>: now reserved 6,000 m, used 0 m of 8,000 m" in body
    assert body.count('class="ts-point') == 15 * 2  # CPU and memory: the node has no GPU
    assert ">8,000 m</text>" in body  # the y axis' top is what it offers
    assert ops.get(f"/console/ops/nodes/{node.pk}/usage?range=7d").status_code == 400
    deadline = timezone.now() + timedelta(minutes=45)
    node_services.node_drain(
        node=node, actor=Actor.system("test"), deadline=deadline, message="kernel"
    )
    leases = ops.get(f"/console/ops/nodes/{node.pk}/leases").content.decode()
    assert "Drain progress:</strong> 1 lease left to end; deadline" in leases
    assert "Used now (measured)" in leases
