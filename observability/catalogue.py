"""The metric names and their labels: a contract (docs/observability.md lists the same).

Labels are bounded: pool, tenant (at most METRICS_TENANT_LABELS of them by name, the rest as
`other`), shape class, zone, reason, outcome, phase, state — never a job, lease or node id."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "computepool_"

# Seconds: from a tenth of a second (an event pass) to a day (a long queue or run).
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PLACEMENT_BUCKETS = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0)


@dataclass(frozen=True)
class Folded:
    """A counter or histogram folded from the event log (observability/fold.py)."""

    name: str  # without the prefix; a counter's without `_total`
    kind: str  # "counter" | "histogram"
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def full_name(self) -> str:
        return PREFIX + self.name


QUEUE_WAIT = Folded(
    "job_queue_wait_seconds",
    "histogram",
    "Seconds a job waited in the queue: from its submission (or its return to the queue) to "
    "its lease.",
    ("pool", "tenant"),
    LATENCY_BUCKETS,
)
SCHEDULING_ATTEMPTS = Folded(
    "scheduling_attempts",
    "counter",
    "Queued jobs a scheduling pass considered, by what became of them (placed, unschedulable: "
    "left waiting, error: the scheduler failed on the job).",
    ("pool", "result"),
)
LEASE_EXPIRATIONS = Folded(
    "lease_expirations",
    "counter",
    "Leases that expired: not committed, or not renewed, in time; by the state they left.",
    ("pool", "from_state"),
)
STARTUP = Folded(
    "job_startup_seconds",
    "histogram",
    "Seconds of a job's start on its node, by phase: image_pull (the agent's image check or "
    "pull until startup began), container_start (startup began until the container ran).",
    ("pool", "phase"),
    LATENCY_BUCKETS,
)
RUNTIME = Folded(
    "job_runtime_seconds",
    "histogram",
    "Seconds an attempt ran, from its container's start to its end, by outcome (succeeded, "
    "failed, cancelled, lost, requeued).",
    ("pool", "outcome"),
    LATENCY_BUCKETS,
)
EXITS = Folded(
    "job_exits",
    "counter",
    "Attempts that ended, by the reason of their end (the reason-code catalogue: exited_zero, "
    "exited_nonzero, oom_killed, max_runtime_exceeded, node_lost, cancelled_by_user, "
    "preempted, …).",
    ("pool", "reason"),
)
RETRIES = Folded(
    "job_retries",
    "counter",
    "Attempts that failed and were queued again by the job's retry policy.",
    ("pool",),
)
PREEMPTIONS = Folded(
    "job_preemptions", "counter", "Jobs preempted for higher-priority work.", ("pool",)
)
PRESSURE = Folded(
    "job_resource_pressure_ratio",
    "histogram",
    "An ended lease's usage over its limit, by resource: cpu (average use over the granted "
    "millicores), memory (peak use over the granted MiB).",
    ("pool", "resource"),
    RATIO_BUCKETS,
)
PASS_DURATION = Folded(
    "scheduling_pass_duration_seconds",
    "histogram",
    "Seconds of one scheduling pass over one pool.",
    ("pool",),
    PASS_BUCKETS,
)
PLACEMENTS_PER_PASS = Folded(
    "placements_per_pass",
    "histogram",
    "Jobs one scheduling pass of one pool placed.",
    ("pool",),
    PLACEMENT_BUCKETS,
)
PLAN_CONFLICTS = Folded(
    "plan_conflicts",
    "counter",
    "Planned placements another writer's change made impossible (the job waits for the next pass).",
    ("pool",),
)

FOLDED = (
    QUEUE_WAIT,
    SCHEDULING_ATTEMPTS,
    LEASE_EXPIRATIONS,
    STARTUP,
    RUNTIME,
    EXITS,
    RETRIES,
    PREEMPTIONS,
    PRESSURE,
    PASS_DURATION,
    PLACEMENTS_PER_PASS,
    PLAN_CONFLICTS,
)

# Gauges read from the database at scrape time (observability/collect.py): name → help.
GAUGES = {
    "pending_jobs": "Queued jobs, by the scheduler's latest pending reason.",
    "oldest_pending_seconds": "Age of the oldest queued job, by priority class.",
    "priority_class_max_wait_seconds": "Each priority class's maximum wait (max_wait_s).",
    "tenant_dominant_share": "A tenant's dominant share of the pool's capacity, held now.",
    "tenant_fair_share": "A tenant's entitlement: its weight over the weights of the tenants "
    "present in the pool.",
    "tenant_pending_jobs": "A tenant's queued jobs in the pool.",
    "capacity": "Capacity by pool, shape class, zone and resource, of each kind: allocatable, "
    "schedulable (ready, reachable, neither draining nor quarantined), reserved, used, free, "
    "fragmented, draining, unhealthy, unreachable.",
    "nodes": "Nodes, by lifecycle state and reachability.",
    "accelerator_utilisation_ratio": "Measured GPU use over the GPU share leased to running jobs.",
    "scheduling_pass_budget_seconds": "How long one pass may take: the pass period.",
}
