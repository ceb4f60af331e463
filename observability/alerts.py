"""The alert rules that ship with Compute Pool, defined once here and rendered to
deploy/prometheus/alerts.yml (`manage.py render_alerts`; a test holds the file to this module,
and runs `promtool check rules` and `promtool test rules` on it). docs/observability.md lists
them with what to do when one fires."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from scheduling.conditions import IDLE_WITH_BACKLOG, OLDEST_PENDING, duration


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


ALERTS = (
    Alert(  # the condition defined once in scheduling/conditions.py (the queue pages' too)
        IDLE_WITH_BACKLOG.name,
        IDLE_WITH_BACKLOG.promql(),
        duration(IDLE_WITH_BACKLOG.for_s),
        "warning",
        "Pool {{ $labels.pool }} has idle capacity while jobs wait",
        "More than half of the pool's schedulable CPU is free and jobs have waited for 10 "
        "minutes for reasons capacity could cure. Check the queue page's pending reasons "
        "(a shape no node fits, a stuck pass, a node that looks ready but is not).",
    ),
    Alert(
        OLDEST_PENDING.name,
        OLDEST_PENDING.promql(),
        duration(OLDEST_PENDING.for_s),
        "warning",
        "A {{ $labels.priority_class }} job in pool {{ $labels.pool }} waits past its class's "
        "maximum wait",
        "The oldest queued job of the class has waited {{ $value | humanizeDuration }}, longer "
        "than the class's max_wait_s.",
    ),
    Alert(
        "ComputePoolPassOverBudget",
        "histogram_quantile(0.99, sum by (pool, le) "
        "(rate(computepool_scheduling_pass_duration_seconds_bucket[5m])))\n"
        "> on () group_left ()\n"
        "computepool_scheduling_pass_budget_seconds",
        "5m",
        "warning",
        "Scheduling passes of pool {{ $labels.pool }} take longer than their period",
        "The 99th percentile pass takes {{ $value | humanizeDuration }}, over the pass period: "
        "placement falls behind. See the scheduler-health page's phases.",
    ),
    Alert(
        "ComputePoolLeaseExpiriesHigh",
        "sum by (pool) (rate(computepool_lease_expirations_total[10m])) * 60 > 1",
        "10m",
        "warning",
        "Leases of pool {{ $labels.pool }} are expiring",
        "More than one lease a minute expired (not committed or not renewed in time) over 10 "
        "minutes: agents or clients are losing their leases.",
    ),
    Alert(
        "ComputePoolNodesUnreachable",
        'sum by (pool) (computepool_nodes{reachable="false", state!="retired"}) > 0',
        "5m",
        "critical",
        "{{ $value }} node(s) of pool {{ $labels.pool }} are unreachable",
        "Their agents have missed heartbeats for 5 minutes: their capacity is not schedulable "
        "and their committed leases are uncertain.",
    ),
    Alert(
        "ComputePoolTenantStarved",
        "(computepool_tenant_dominant_share < 0.5 * computepool_tenant_fair_share)\n"
        "and on (pool, tenant)\n"
        "(computepool_tenant_pending_jobs > 0)",
        "15m",
        "warning",
        "Tenant {{ $labels.tenant }} is starved in pool {{ $labels.pool }}",
        "The tenant holds less than half of its fair share while its jobs wait, for 15 "
        "minutes. Check its pending reasons (quota, shapes no node fits) and fair-share page.",
    ),
)


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as people write them."""


def _string(dumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def render() -> str:
    """deploy/prometheus/alerts.yml, as it must read."""
    document = {"groups": [{"name": "computepool", "rules": [a.rule() for a in ALERTS]}]}
    header = "# Rendered from observability/alerts.py by `manage.py render_alerts`: edit there.\n"
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)
