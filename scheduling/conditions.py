"""Scheduler health conditions, each defined once: "idle capacity with backlog" and "oldest
pending past its class's maximum wait".

Each condition is structured data (the metrics it reads, its thresholds, the pending reasons it
leaves out, how long it must hold) from which both readings are derived:

* `promql()` — the expression of the shipped alert rule (observability/alerts.py renders it to
  deploy/prometheus/alerts.yml);
* `evaluate(figures)` — the same test in Python over one pool's `Figures`, the numbers /metrics
  exposes (`computepool_capacity`, `computepool_pending_jobs`, `computepool_oldest_pending_
  seconds`, `computepool_priority_class_max_wait_seconds`), which the queue pages show.

tests/scheduling/test_conditions.py feeds the same figures to both (promtool's rule tests) and
holds them equal. The figures themselves are read here too (`pending_counts`, `oldest_pending`,
`class_max_waits`): observability/collect.py exposes these very reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Min
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from pools.models import PriorityClass

NOT_YET_CONSIDERED = "not_yet_considered"  # a queued job no pass has looked at yet
NO_CLASS = "none"  # a queued job without a priority class
# Pending reasons that capacity cannot cure: such a backlog beside idle capacity is the policy
# working, not the scheduler failing.
POLICY_WAITS = (
    "quota_exceeded",
    "credit_exhausted",
    "reservation_window_not_open",
    "gang_incomplete",
)


@dataclass(frozen=True)
class Figures:
    """One pool's figures as /metrics exposes them: capacity summed over the pool's cells
    (kind → resource → amount), queued jobs by pending reason, the oldest queued job's age
    by priority class, and the classes' maximum waits (seconds; classes without one absent)."""

    pool: str
    capacity: dict = field(default_factory=dict)
    pending: dict = field(default_factory=dict)
    oldest: dict = field(default_factory=dict)
    max_wait: dict = field(default_factory=dict)


@dataclass(frozen=True)
class IdleCapacityWithBacklog:
    """More than `free_fraction` of the pool's schedulable `resource` is free while jobs wait
    for reasons capacity could cure (any but `excluded`)."""

    name: str = "ComputePoolIdleCapacityWithBacklog"
    resource: str = "cpu_millicores"
    free_fraction: float = 0.5
    excluded: tuple = POLICY_WAITS
    for_s: int = 600

    def promql(self) -> str:
        capacity = 'sum by (pool) (computepool_capacity{{kind="{kind}", resource="{r}"}})'
        return (
            f"({capacity.format(kind='free', r=self.resource)}\n"
            f"  / {capacity.format(kind='schedulable', r=self.resource)} > {self.free_fraction})\n"
            "and on (pool)\n"
            f'(sum by (pool) (computepool_pending_jobs{{reason!~"{"|".join(self.excluded)}"}}) > 0)'
        )

    def backlog(self, figures: Figures) -> int:
        return sum(n for reason, n in figures.pending.items() if reason not in self.excluded)

    def free_ratio(self, figures: Figures) -> float | None:
        schedulable = figures.capacity.get("schedulable", {}).get(self.resource, 0)
        free = figures.capacity.get("free", {}).get(self.resource, 0)
        return free / schedulable if schedulable else None

    def evaluate(self, figures: Figures) -> dict | None:
        """None when the condition does not hold; else what makes it hold."""
        ratio, backlog = self.free_ratio(figures), self.backlog(figures)
        if ratio is None or ratio <= self.free_fraction or backlog <= 0:
            return None
        return {"pool": figures.pool, "free_ratio": ratio, "backlog": backlog}


@dataclass(frozen=True)
class OldestPendingPastMaxWait:
    """The oldest queued job of a priority class has waited longer than the class's maximum
    wait (classes without one never count)."""

    name: str = "ComputePoolOldestPendingPastMaxWait"
    for_s: int = 60

    def promql(self) -> str:
        return (
            "max by (pool, priority_class) (computepool_oldest_pending_seconds)\n"
            "> on (priority_class) group_left ()\n"
            "computepool_priority_class_max_wait_seconds"
        )

    def evaluate(self, figures: Figures) -> list[dict]:
        """Each class of the pool past its maximum wait (empty: the condition does not hold)."""
        return [
            {"pool": figures.pool, "priority_class": cls, "age_s": age, "max_wait_s": limit}
            for cls, age in sorted(figures.oldest.items())
            if (limit := figures.max_wait.get(cls)) is not None and age > limit
        ]


IDLE_WITH_BACKLOG = IdleCapacityWithBacklog()
OLDEST_PENDING = OldestPendingPastMaxWait()


def duration(seconds: int) -> str:
    """A rule's `for` as Prometheus writes it (600 → "10m")."""
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


# --- the figures, read as /metrics exposes them ------------------------------------------------


def _queued(pool_id=None):
    queued = Job.objects.filter(state=JobState.QUEUED).order_by()
    return queued if pool_id is None else queued.filter(pool_id=pool_id)


def pending_counts(pool_id=None) -> dict:
    """(pool id, reason code) → queued jobs (`computepool_pending_jobs`)."""
    rows = _queued(pool_id).values("pool_id", "pending_reason__code").annotate(n=Count("id"))
    return {(r["pool_id"], r["pending_reason__code"] or NOT_YET_CONSIDERED): r["n"] for r in rows}


def oldest_pending(now=None, pool_id=None) -> dict:
    """(pool id, priority class name) → seconds the oldest queued job has waited since it was
    (last) queued (`computepool_oldest_pending_seconds`)."""
    now = now or timezone.now()
    rows = (
        _queued(pool_id)
        .values("pool_id", "priority_class__name")
        .annotate(since=Min("state_changed_at"))
    )
    return {
        (r["pool_id"], r["priority_class__name"] or NO_CLASS): max(
            0.0, (now - r["since"]).total_seconds()
        )
        for r in rows
    }


def class_max_waits() -> dict:
    """priority class name → its maximum wait in seconds
    (`computepool_priority_class_max_wait_seconds`)."""
    classes = PriorityClass.objects.filter(max_wait_s__isnull=False).order_by("name")
    return dict(classes.values_list("name", "max_wait_s"))


def pool_figures(pool, capacity: dict, now=None) -> Figures:
    """The pool's figures now; `capacity`: the pool's capacity totals (kind → resource →
    amount: `scheduling.selectors.capacity_breakdown`'s row of the pool, which the capacity
    gauge sums)."""
    now = now or timezone.now()
    pending = {reason: n for (_, reason), n in pending_counts(pool.pk).items()}
    oldest = {cls: age for (_, cls), age in oldest_pending(now, pool.pk).items()}
    return Figures(pool.slug, capacity, pending, oldest, class_max_waits())


def held_since(samples: list, condition: IdleCapacityWithBacklog = IDLE_WITH_BACKLOG):
    """When the condition began to hold without a break, over capacity samples (oldest first,
    each with `at`, `totals` and `queued`); None when the latest sample does not show it."""
    since = None
    for sample in samples:
        figures = Figures("", sample["totals"] or {}, sample["queued"] or {})
        if sample.get("error") or condition.evaluate(figures) is None:
            since = None
        elif since is None:
            since = sample["at"]
    return since


def firing_for(since, now, condition) -> bool:
    """Whether a condition that has held since `since` has held its `for` (the alert fires)."""
    return since is not None and now - since >= timedelta(seconds=condition.for_s)
