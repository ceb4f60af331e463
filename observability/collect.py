"""The exposition of /metrics: the folded counters and histograms (observability/fold.py), the
gauges read from the database at scrape time, and each process's own (observability/process.py).

The capacity gauge is the operators' capacity page's own computation
(`scheduling.selectors.capacity_breakdown`), not a second one, so the two never disagree."""

from __future__ import annotations

import os
from collections import defaultdict

import orjson
from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY

from leases.selectors import CAPACITY_MEASURES
from nodes.models import Node
from pools.actors import Actor
from pools.models import ComputePool, Tenant
from scheduling import conditions, selectors

from . import catalogue as m
from .fold import tenant_labels
from .models import MetricSeries


def exposition() -> bytes:
    """The text of /metrics."""
    processes = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        processes = CollectorRegistry()
        MultiProcessCollector(processes)
    control_plane = CollectorRegistry()
    control_plane.register(ControlPlaneCollector())
    return generate_latest(control_plane) + generate_latest(processes)


class ControlPlaneCollector:
    def collect(self):
        yield from folded_families()
        yield from queue_gauges()
        yield from share_gauges()
        yield from capacity_gauges()


def _gauge(name: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(m.PREFIX + name, m.GAUGES[name], labels=labels)


def folded_families():
    rows = defaultdict(list)
    for name, labels, value in MetricSeries.objects.values_list("name", "labels", "value"):
        rows[name].append((orjson.loads(labels), value))
    for metric in m.FOLDED:
        if metric.kind == "counter":
            family = CounterMetricFamily(metric.full_name, metric.help, labels=metric.labels)
            for labels, value in rows[metric.name]:
                family.add_metric([labels.get(k, "") for k in metric.labels], value)
            yield family
            continue
        family = HistogramMetricFamily(metric.full_name, metric.help, labels=metric.labels)
        sums = {_key(labels, metric): value for labels, value in rows[metric.name + "_sum"]}
        buckets = defaultdict(list)
        for labels, value in rows[metric.name + "_bucket"]:
            buckets[_key(labels, metric)].append((labels["le"], value))
        for key, series in sorted(buckets.items()):
            series.sort(key=lambda b: float(b[0]))
            family.add_metric(list(key), series, sums.get(key, 0.0))
        yield family


def _key(labels: dict, metric: m.Folded) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in metric.labels)


def queue_gauges():
    """The queue's figures, read by scheduling/conditions.py: the same reads the queue pages'
    health conditions evaluate."""
    now = timezone.now()
    pools = dict(ComputePool.objects.values_list("pk", "slug"))
    pending = _gauge("pending_jobs", ("pool", "reason"))
    for (pool_id, reason), n in conditions.pending_counts().items():
        pending.add_metric([pools[pool_id], reason], n)
    yield pending
    oldest = _gauge("oldest_pending_seconds", ("pool", "priority_class"))
    for (pool_id, priority_class), age in conditions.oldest_pending(now).items():
        oldest.add_metric([pools[pool_id], priority_class], age)
    yield oldest
    max_wait = _gauge("priority_class_max_wait_seconds", ("priority_class",))
    for name, seconds in conditions.class_max_waits().items():
        max_wait.add_metric([name], seconds)
    yield max_wait
    budget = _gauge("scheduling_pass_budget_seconds", ())
    budget.add_metric([], settings.SCHEDULER_PASS_PERIOD_S)
    yield budget


def share_gauges():
    """Each tenant's dominant share held now and its entitlement, per pool (the fair-share
    page's figures); tenants past METRICS_TENANT_LABELS are summed as `other`."""
    named = tenant_labels()
    slugs = {slug: named(pk) for pk, slug in _tenant_slugs().items()}
    gauges = [
        (_gauge(name, ("pool", "tenant")), field)
        for name, field in (
            ("tenant_dominant_share", "share"),
            ("tenant_fair_share", "entitlement"),
            ("tenant_pending_jobs", "waiting_total"),
        )
    ]
    for pool in ComputePool.objects.order_by("slug"):
        sums = defaultdict(lambda: [0.0] * len(gauges))
        for row in selectors.fairness(pool):
            label = slugs.get(row["tenant"], "other")
            for i, (_, field) in enumerate(gauges):
                sums[label][i] += row[field]
        for label, values in sorted(sums.items()):
            for (gauge, _), value in zip(gauges, values, strict=True):
                gauge.add_metric([pool.slug, label], value)
    for gauge, _ in gauges:
        yield gauge


def _tenant_slugs() -> dict[int, str]:
    return dict(Tenant.objects.values_list("pk", "slug"))


def capacity_gauges():
    pools = list(ComputePool.objects.order_by("slug"))
    breakdown = selectors.capacity_breakdown(Actor.system("metrics"), pools)
    capacity = _gauge("capacity", ("pool", "shape_class", "zone", "resource", "kind"))
    for (pool, shape_class, zone), totals in breakdown["cell"].items():
        for kind in CAPACITY_MEASURES:
            for resource in selectors.DIMENSIONS:
                value = totals[kind][resource]
                capacity.add_metric([pool, shape_class, zone, resource, kind], value)
    yield capacity
    utilisation = _gauge("accelerator_utilisation_ratio", ("pool",))
    for pool, totals in breakdown["pool"].items():
        if leased := totals["reserved"]["gpu_milli"]:
            utilisation.add_metric([pool], totals["used"]["gpu_milli"] / leased)
    yield utilisation
    nodes = _gauge("nodes", ("pool", "state", "reachable"))
    slugs = {pool.pk: pool.slug for pool in pools}
    rows = Node.objects.order_by().values("pool_id", "state", "reachability")
    for row in rows.annotate(n=Count("id")):
        reachable = "true" if row["reachability"] == "reachable" else "false"
        nodes.add_metric([slugs.get(row["pool_id"], ""), row["state"], reachable], row["n"])
    yield nodes
