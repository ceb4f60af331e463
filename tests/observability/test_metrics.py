"""GET /metrics (docs/observability.md, "Metrics"): the event log folded into counters and
histograms exactly once, the gauges read at scrape time, who may scrape, bounded labels."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from config.builders import (
    SYSTEM,
    build_node,
    build_tenant,
    cpu_request,
    submit_job,
    submit_jobs,
)
from jobs.models import JobEvent
from leases.models import Lease
from leases.services import lease_commit, lease_release, lease_reserve
from leases.tasks import expire_leases
from nodes.choices import Reachability
from nodes.models import Node
from observability.fold import fold
from observability.models import MetricSeries
from pools.actors import Actor
from pools.reasons import Reason
from scheduling import selectors
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client, client_for
from tests.jobs.test_agent_api import RETRY_TWICE, place, report, run

pytestmark = pytest.mark.django_db
MIN = timedelta(minutes=1)


def scrape(client) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition: (name, sorted labels) → value."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def node_api(agent):
    return bearer_client(agent.secret)


@pytest.fixture
def ops(operator):
    return client_for(operator)


def test_a_job_s_life_moves_each_metric_once(agent, node_api, tenant, ops):
    pool = agent.node.pool.slug
    fold()  # whatever the fixtures wrote
    before = scrape(ops)
    job, lease = place(submit_job(agent.node.pool, tenant))
    assert report(node_api, job, lease, "pulling", pull_seconds=1.5).status_code == 200
    for step in ("starting", "running"):
        assert report(node_api, job, lease, step).status_code == 200
    assert report(node_api, job, lease, "succeeded", exit_code=0).status_code == 200

    fold()
    after = scrape(ops)
    assert fold() == {"job_events": 0, "lease_events": 0, "passes": 0}  # nothing twice

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    waited = {"pool": pool, "tenant": tenant.slug}
    assert moved("computepool_job_queue_wait_seconds_count", **waited) == 1
    assert moved("computepool_job_queue_wait_seconds_bucket", le="+Inf", **waited) == 1
    pull = {"pool": pool, "phase": "image_pull"}
    assert moved("computepool_job_startup_seconds_count", **pull) == 1
    assert moved("computepool_job_startup_seconds_sum", **pull) == pytest.approx(1.5)
    assert moved("computepool_job_startup_seconds_bucket", le="1.0", **pull) == 0
    assert moved("computepool_job_startup_seconds_bucket", le="2.5", **pull) == 1
    assert moved("computepool_job_startup_seconds_count", pool=pool, phase="container_start") == 1
    assert moved("computepool_job_runtime_seconds_count", pool=pool, outcome="succeeded") == 1
    assert moved("computepool_job_exits_total", pool=pool, reason="exited_zero") == 1
    assert moved("computepool_scheduling_attempts_total", pool=pool, result="placed") == 1
    assert moved("computepool_scheduling_pass_duration_seconds_count", pool=pool) >= 1
    assert moved("computepool_placements_per_pass_sum", pool=pool) == 1
    # the gauges: nothing queued, the node ready and reachable
    assert value(after, "computepool_nodes", pool=pool, state="ready", reachable="true") == 1
    assert value(after, "computepool_scheduling_pass_budget_seconds") == 2.0


def test_a_retried_failure_counts_its_reason_and_a_retry(agent, node_api, tenant, ops):
    pool = agent.node.pool.slug
    job, lease = place(submit_job(agent.node.pool, tenant, retry_policy=RETRY_TWICE))
    run(node_api, job, lease)
    failed = report(node_api, job, lease, "failed", reason="exited_nonzero", exit_code=3)
    assert failed.json()["state"] == "queued"
    fold()
    samples = scrape(ops)
    assert value(samples, "computepool_job_exits_total", pool=pool, reason="exited_nonzero") == 1
    assert value(samples, "computepool_job_retries_total", pool=pool) == 1
    assert value(samples, "computepool_job_runtime_seconds_count", pool=pool, outcome="requeued")
    # queued again, past its backoff: its wait is a gauge until a pass places it
    assert value(samples, "computepool_pending_jobs", pool=pool, reason="not_yet_considered") == 1
    assert value(samples, "computepool_oldest_pending_seconds", pool=pool, priority_class="none")


def exits() -> dict[str, float]:
    return dict(MetricSeries.objects.filter(name="job_exits").values_list("labels", "value"))


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_after_a_later_one_is_still_counted_once(agent, tenant):
    """Event ids are handed out before commit: a transaction still open when the fold reads
    may commit an event below the fold's high water. It is folded on a later run, once."""
    job = submit_job(agent.node.pool, tenant)
    fold()
    inserted, commit = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with transaction.atomic():
                JobEvent.record(
                    job, actor=Actor.system("test"), from_state="running", to_state="failed",
                    reason=Reason.OOM_KILLED,
                )  # fmt: skip
                inserted.set()
                commit.wait(10)
        finally:
            connection.close()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inserted.wait(10)
    JobEvent.record(
        job, actor=Actor.system("test"), from_state="running", to_state="failed",
        reason=Reason.EXITED_NONZERO,
    )  # fmt: skip
    fold()
    assert exits() == {'{"pool":"private","reason":"exited_nonzero"}': 1.0}
    commit.set()
    writer.join(10)
    fold()
    assert exits() == {
        '{"pool":"private","reason":"exited_nonzero"}': 1.0,
        '{"pool":"private","reason":"oom_killed"}': 1.0,
    }


def test_tenants_past_the_label_cap_fold_into_other(agent, node_api, tenant, ops):
    late = build_tenant("late", name="Late")
    with override_settings(METRICS_TENANT_LABELS=1):
        for who in (tenant, late):
            place(submit_job(agent.node.pool, who))
        fold()
        samples = scrape(ops)
    pool = agent.node.pool.slug
    assert value(samples, "computepool_job_queue_wait_seconds_count", pool=pool, tenant="vision")
    assert value(samples, "computepool_job_queue_wait_seconds_count", pool=pool, tenant="other")
    assert not any(("tenant", "late") in labels for _, labels in samples)


def test_a_thousand_jobs_add_no_series_per_job(pool, tenant, ops):
    build_node(pool, "big", cpu=2_000_000, memory=4_000_000, scratch=10_000_000)

    def run_jobs(count):
        spec = {"tenant": tenant, "name": "tiny", "resources": {"cpu_millicores_min": 100}}
        submit_jobs(pool, [spec] * count)
        scheduling_pass()
        fold()
        return scrape(ops)

    few = run_jobs(10)
    many = run_jobs(1000)
    assert set(many) == set(few)
    assert value(
        many, "computepool_job_queue_wait_seconds_count", pool="test", tenant="vision"
    ) == (1010)


def test_capacity_is_the_capacity_page_s_own_figures(pool, ops, operator):
    build_node(pool, "n1", cpu=4000, memory=8192)
    build_node(pool, "n2", cpu=8000, memory=16384)
    Node.objects.filter(name="n2").update(reachability=Reachability.UNREACHABLE)
    samples = scrape(ops)
    [(cell, totals)] = selectors.capacity_breakdown(Actor.for_user(operator), [pool])[
        "cell"
    ].items()
    labels = dict(zip(("pool", "shape_class", "zone"), cell, strict=True))
    for kind in ("allocatable", "schedulable", "free", "unreachable"):
        expected = totals[kind]["cpu_millicores"]
        got = value(samples, "computepool_capacity", resource="cpu_millicores", kind=kind, **labels)
        assert got == expected, kind
    # an unreachable node is neither schedulable nor free
    up, down = (Node.objects.get(name=name).cpu_millicores_allocatable for name in ("n1", "n2"))
    assert totals["allocatable"]["cpu_millicores"] == up + down
    assert totals["schedulable"]["cpu_millicores"] == up
    assert totals["free"]["cpu_millicores"] == up
    assert totals["unreachable"]["cpu_millicores"] == down
    assert value(samples, "computepool_nodes", pool="test", state="ready", reachable="false") == 1


# --- who may scrape ----------------------------------------------------------------------------


def test_tenants_and_strangers_get_403_operators_and_scrape_tokens_200(member, operator, client):
    assert client_for(member).get("/metrics").status_code == 403
    assert client_for(None).get("/metrics").status_code == 403
    assert bearer_client("cpu_not-a-token").get("/metrics").status_code == 403
    assert client_for(operator).get("/metrics").status_code == 200
    scrape_only = client_for(operator, scopes=["metrics:read"])
    assert scrape_only.get("/metrics").status_code == 200
    # the scrape token reads nothing else
    assert scrape_only.get("/api/v1/jobs").status_code == 403
    client.force_login(operator)
    assert client.get("/metrics").status_code == 200
    client.force_login(member)
    assert client.get("/metrics").status_code == 403


def test_only_operators_may_hold_a_scrape_token(member, operator):
    tokens, body = "/api/v1/tokens", {"name": "prometheus", "scopes": ["metrics:read"]}
    signed_in = APIClient()
    signed_in.force_login(member)
    refused = signed_in.post(tokens, body, "json")
    assert refused.status_code == 400
    assert refused.json()["scopes"] == ["Only operators may hold the metrics:read scope."]
    signed_in.force_login(operator)
    made = signed_in.post(tokens, body, "json")
    assert made.status_code == 201, made.json()
    assert bearer_client(made.json()["secret"]).get("/metrics").status_code == 200


@override_settings(METRICS_ALLOWED_CIDRS=["10.1.0.0/16"], TRUSTED_PROXY_CIDRS=["192.0.2.1/32"])
def test_allowed_networks_scrape_and_a_balancer_s_forwarded_address_counts(client, db):
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.2.0.1").status_code == 403
    via_balancer = {"REMOTE_ADDR": "192.0.2.1"}
    forwarded = client.get("/metrics", HTTP_X_FORWARDED_FOR="10.1.9.9", **via_balancer)
    assert forwarded.status_code == 200
    # a client's own X-Forwarded-For entry is further left: never read
    spoofed = client.get("/metrics", HTTP_X_FORWARDED_FOR="10.1.9.9, 203.0.113.7", **via_balancer)
    assert spoofed.status_code == 403
    # not from the balancer: the header is not read at all
    direct = client.get("/metrics", REMOTE_ADDR="203.0.113.7", HTTP_X_FORWARDED_FOR="10.1.9.9")
    assert direct.status_code == 403


def test_an_assignment_says_when_its_lease_was_made(agent, node_api, tenant):
    """The agent's assignment lag (worker_agent/metrics.py) is measured from this."""
    _, lease = place(submit_job(agent.node.pool, tenant))
    [entry] = node_api.get("/api/v1/agent/assignments").json()
    assert entry["leased_at"] == lease.created_at.isoformat()


def test_lease_expiries_and_an_ended_lease_s_pressure(lpool, ltenant, lnode, loperator):
    now = timezone.now()
    request = cpu_request()
    expiring = lease_reserve(
        pool=lpool, tenant=ltenant, request=request, actor=SYSTEM, now=now, duration=MIN
    )
    assert expire_leases(now=now + 2 * MIN) == 1
    used = lease_reserve(
        pool=lpool, tenant=ltenant, request=request, actor=SYSTEM, now=now, duration=10 * MIN
    )
    lease_commit(lease=used, fencing_token=used.fencing_token, actor=SYSTEM, now=now)
    # what the agent's heartbeats left on it: half its CPU on average, 90 % of its memory at peak
    Lease.objects.filter(pk=used.pk).update(
        usage_samples=3,
        usage_average={"cpu_millicores": used.cpu_millicores / 2},
        usage_peak={"memory_mib": used.memory_mib * 0.9},
    )
    lease_release(lease=used, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=now)
    fold()
    samples = scrape(client_for(loperator))
    pool = lpool.slug
    assert expiring.pk != used.pk
    assert value(samples, "computepool_lease_expirations_total", pool=pool, from_state="reserved")
    cpu = {"pool": pool, "resource": "cpu"}
    assert value(samples, "computepool_job_resource_pressure_ratio_count", **cpu) == 1
    assert value(samples, "computepool_job_resource_pressure_ratio_sum", **cpu) == 0.5
    memory = {"pool": pool, "resource": "memory"}
    assert (
        value(samples, "computepool_job_resource_pressure_ratio_bucket", le="0.75", **memory) == 0
    )
    assert value(samples, "computepool_job_resource_pressure_ratio_bucket", le="0.9", **memory) == 1


def test_an_event_with_odd_data_never_stops_the_fold(agent, tenant):
    job = submit_job(agent.node.pool, tenant)
    for data in (["a list"], {"failure": ["not", "a", "code"]}, {"pull_seconds": "soon"}):
        JobEvent.record(
            job, actor=Actor.system("test"), from_state="running", to_state="queued",
            reason=Reason.RETRY_SCHEDULED, data=data,
        )  # fmt: skip
    assert fold()["job_events"] == 4  # the submit's event and the three
    assert exits() == {'{"pool":"private","reason":"retry_scheduled"}': 3.0}
