"""Queue policy: which queued job a pass tries first, and which it may start. Pure: the pass
reads the rows (scheduling/fairshare.py), this decides. docs/scheduler.md "Queue policy".

* `order(jobs, standings, capacity, policy)` — weighted dominant-resource fairness by
  progressive filling: within the highest band, the next job is the oldest one of the tenant
  whose dominant share (held + decayed past use + what this order already handed it) over its
  weight is the least. Bands: jobs near their class's maximum wait first, then by priority
  value, which a waiting job climbs by aging.
* `Gate` — what the planning loop may start: the share kept for short jobs, and backfill that
  never delays a head job that is waiting for capacity.
* `QueuePolicy` — the queue's knobs and their defaults, `from_knobs` validates them. They are the
  core's own: the pool knobs of the same names (pools/knobs.py) take these defaults and checks.
* Decayed usage — `accrued`, `decay` and `usage_as_held`: the arithmetic of fair share's memory.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from dataclasses import dataclass, replace

RESOURCES = ("cpu_millicores", "memory_mib", "gpus")
ZERO = (0.0, 0.0, 0.0)
EPSILON = 1e-9

# Why a job went first (`QueuedJob.why`) or may not start now (`Gate.admits`): stable codes,
# kept in a job's pending reason by the pass.
MAX_WAIT_URGENT = "max_wait_urgent"
SHORT_SHARE_RESERVED = "short_share_reserved"
BACKFILL_WOULD_DELAY_HEAD = "backfill_would_delay_head"


@dataclass(frozen=True)
class QueuedJob:
    id: int
    tenant: int | str
    priority: int = 0  # the priority class's value
    waited_s: float = 0.0  # since it was (last) queued
    demand: tuple[float, float, float] = ZERO  # cpu millicores, MiB, GPUs (a share counts 0.25)
    max_runtime_s: int | None = None  # declared; None: unbounded (never short, never backfills)
    max_wait_s: int | None = None  # its class's target
    why: str = ""  # set by `order` when the job jumped the bands (MAX_WAIT_URGENT)


@dataclass
class TenantStanding:
    tenant: int | str
    weight: float = 1.0
    held: tuple[float, float, float] = ZERO  # what it holds now, as `demand`
    # its decayed past use, as the amount that held all along would give (`usage_as_held`)
    usage: tuple[float, float, float] = ZERO
    held_long: tuple[float, float, float] = ZERO  # the part of `held` that is not short jobs


# --- knobs ------------------------------------------------------------------------------------

MAX_KNOB_S = 365 * 86400


def _seconds(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "a number of seconds"
    return None if 1 <= value <= MAX_KNOB_S else f"between 1 and {MAX_KNOB_S} s"


def _fraction(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "a number"
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if math.isfinite(value) and above and below:
            return None
        return f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    return check


def _count(low: int, high: int):
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"an integer between {low} and {high}"
        return None

    return check


# knob name → check returning what the value must be, or None when it is valid. The names are
# QueuePolicy's fields; pools/knobs.py declares the pool knobs with these checks.
QUEUE_KNOBS = {
    "fair_share_half_life_s": _seconds,
    "aging_step_s": _seconds,
    "aging_max_bonus": _count(0, 1_000_000),
    "max_wait_urgent_fraction": _fraction(0, 1, low_open=True),
    "short_job_max_runtime_s": _count(0, MAX_KNOB_S),
    "short_job_share": _fraction(0, 1, high_open=True),
    "backfill_reservations": _count(1, 100),
    "long_job_min_runtime_s": _count(1, MAX_KNOB_S),
}


@dataclass(frozen=True)
class QueuePolicy:
    """The queue's knobs with their defaults (a pool overrides them in its policy's knobs)."""

    fair_share_half_life_s: float = 3600.0  # past use counts half after this long
    aging_step_s: float = 60.0  # a waiting job gains one priority point per step …
    aging_max_bonus: int = 100  # … up to this many (the default classes are 100 apart)
    # a job that has waited this fraction of its class's max wait goes first: the rest of the
    # target is the time the backfill gate has to free room for it
    max_wait_urgent_fraction: float = 0.5
    short_job_max_runtime_s: int = 600  # declared max runtime up to this: a short job
    # of each resource, kept from long jobs for short ones; 0: none kept (a pool opts in, since
    # the share idles while no short job waits)
    short_job_share: float = 0.0
    backfill_reservations: int = 1  # heads the gate protects per pass (1: EASY backfill)
    long_job_min_runtime_s: int = 4 * 3600  # the forecast's "long" class

    @classmethod
    def from_knobs(cls, knobs: dict | None) -> QueuePolicy:
        """The policy a pool's knobs describe; knobs of other layers are ignored. A bad value
        raises ValueError naming the knob."""
        if knobs is None:
            return cls()
        if not isinstance(knobs, dict):
            raise ValueError("knobs must be a map of knob name to value")
        values = {}
        for name, check in QUEUE_KNOBS.items():
            if name in knobs:
                if problem := check(knobs[name]):
                    raise ValueError(f"{name} must be {problem}")
                values[name] = knobs[name]
        return cls(**values)

    def is_short(self, max_runtime_s: int | None) -> bool:
        """A short job declares a max runtime of at most `short_job_max_runtime_s`."""
        return max_runtime_s is not None and max_runtime_s <= self.short_job_max_runtime_s


def queue_class(job: QueuedJob, policy: QueuePolicy) -> str:
    """The forecast's coarse class: short, gpu, long or standard (first that applies)."""
    if policy.is_short(job.max_runtime_s):
        return "short"
    if job.demand[2] > 0:
        return "gpu"
    if job.max_runtime_s is None or job.max_runtime_s >= policy.long_job_min_runtime_s:
        return "long"
    return "standard"


# --- decayed usage ----------------------------------------------------------------------------
# Usage is kept in resource-seconds (CPU millicore-seconds, MiB-seconds, GPU-seconds), every
# second weighted by 2^-(its age / half-life). Holding R for ever gives R × τ with τ the mean
# life (half-life / ln 2), so usage / τ is "what it held, on average, lately" in the units of
# `held`, and shares of it compare to capacity.


def mean_life_s(half_life_s: float) -> float:
    return half_life_s / math.log(2)


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    return value * 0.5 ** (max(elapsed_s, 0.0) / half_life_s)


def accrued(amount: float, since_s: float, until_s: float, half_life_s: float) -> float:
    """Decayed resource-seconds, now, of holding `amount` from `since_s` to `until_s` seconds
    ago (since_s ≥ until_s ≥ 0): the integral of amount × 2^-(age / half-life)."""
    if since_s <= until_s:
        return 0.0
    tau = mean_life_s(half_life_s)
    return amount * tau * (0.5 ** (until_s / half_life_s) - 0.5 ** (since_s / half_life_s))


def usage_as_held(usage_s, half_life_s: float) -> tuple[float, float, float]:
    tau = mean_life_s(half_life_s)
    return tuple(u / tau for u in usage_s)


# --- order ------------------------------------------------------------------------------------


def dominant_share(held, capacity) -> float:
    """The largest fraction of any resource of the pool that `held` is (DRF's dominant share)."""
    return max((h / c for h, c in zip(held, capacity, strict=True) if c > 0), default=0.0)


def order(
    jobs: list[QueuedJob],
    standings: dict,
    capacity: tuple[float, float, float],
    policy: QueuePolicy | None = None,
    *,
    limit: int | None = None,
) -> list[QueuedJob]:
    """The jobs in the order a pass should try them (the first `limit` of it).

    Bands, highest first: (1) urgent — waited at least `max_wait_urgent_fraction` of its class's
    max wait (returned with `why=MAX_WAIT_URGENT`); (2) by effective priority: the highest
    priority value among the queued jobs that the job's value plus its aging bonus
    (one point per `aging_step_s` waited, at most `aging_max_bonus`) reaches. So waiting lifts
    a job into a higher class's band, where it competes on fair share — within a band, age
    does not beat fair share, or a flood submitted early would take the pool.
    Within a band, progressive filling: the tenant with the least dominant share of held +
    decayed use + what this order handed it, over its weight, gives its next job (oldest first).
    Ties: the tenant whose next job waited longest, then the lowest job id.
    """
    policy = policy or QueuePolicy()
    if not jobs:
        return []
    values = sorted({job.priority for job in jobs})
    step, cap, urgent_at = (
        policy.aging_step_s,
        policy.aging_max_bonus,
        policy.max_wait_urgent_fraction,
    )

    per_tenant: dict = {}  # tenant → heap of (not urgent, -effective priority, -waited, id, job)
    for job in jobs:
        reached = job.priority + min(cap, int(job.waited_s // step))
        effective = values[bisect_right(values, reached) - 1]
        calm = job.max_wait_s is None or job.waited_s < urgent_at * job.max_wait_s
        per_tenant.setdefault(job.tenant, []).append((calm, -effective, -job.waited_s, job.id, job))

    # inverse capacities: a resource the pool lacks (0) never makes a share
    inverse = [1 / c if c > 0 else 0.0 for c in capacity]
    tenants = []  # heap of (its next job's band, share / weight, -waited, id, tenant index)
    totals, weights, keys = [], [], list(per_tenant)
    for index, tenant in enumerate(keys):
        heap = per_tenant[tenant]
        heapq.heapify(heap)
        standing = standings.get(tenant) or TenantStanding(tenant)
        totals.append([h + u for h, u in zip(standing.held, standing.usage, strict=True)])
        weights.append(1 / max(standing.weight, EPSILON))
        calm, effective, waited, job_id, _ = heap[0]
        share = max(t * i for t, i in zip(totals[index], inverse, strict=True)) * weights[index]
        tenants.append((calm, effective, share, waited, job_id, index))
    heapq.heapify(tenants)

    out: list[QueuedJob] = []
    wanted = len(jobs) if limit is None else min(limit, len(jobs))
    while len(out) < wanted:
        index = heapq.heappop(tenants)[-1]
        heap = per_tenant[keys[index]]
        calm, _, _, _, job = heapq.heappop(heap)
        out.append(job if calm else replace(job, why=MAX_WAIT_URGENT))
        total = totals[index]
        for r, d in enumerate(job.demand):
            total[r] += d
        if heap:
            calm, effective, waited, job_id, _ = heap[0]
            share = max(t * i for t, i in zip(total, inverse, strict=True)) * weights[index]
            heapq.heappush(tenants, (calm, effective, share, waited, job_id, index))
    return out


# --- the gate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reservation:
    demand: tuple[float, float, float]
    start_s: float | None  # when it could start at the earliest, in seconds from now
    job: int | None = None  # the head it holds for, and its tenant: whom a refusal may name
    tenant: int | str | None = None


class Gate:
    """Whether the planning loop may start a job now, on the pool's totals (not per node).

    Build one per pass: `Gate(capacity, held_total, policy, held_long=...)`, where
    `held_total` is what every lease of the pool holds and `held_long` the part held by long
    jobs (not short; leases without a job count as long; when not given, all of `held_total`,
    which is the cautious reading), or `Gate.from_standings`. For each job in `order`:

        if code := gate.admits(job): pending with `code`
        elif it is placed: gate.took(job)
        elif it waits for capacity: gate.blocked(job, earliest_start_s)

    Rules (`admits` returns "" or the code):
    * `short_share_reserved` — a long job (no declared max runtime, or above
      `short_job_max_runtime_s`) may not bring what long jobs hold above
      (1 − `short_job_share`) of any resource it asks for: that share stays for short jobs.
      The first long job refused so keeps its place: later long jobs may not take the long
      room it waits for (else smaller long jobs would starve a large one). A job that does not
      fit what is free at all is not refused for this: it waits for capacity (`blocked`).
    * `backfill_would_delay_head` — EASY backfill. Once a job could not be placed,
      `blocked` reserves its demand (for the first `backfill_reservations` such jobs). A later
      job is admitted only if it cannot delay any reserved head: its declared max runtime ends
      before that head's earliest start (`earliest_start_s`, when the head's capacity frees up;
      None = unknown, so no job ends before it), or it fits in what is free beside every
      reservation (free − the reserved demands, on each resource it asks for) — so it uses
      nothing a head waits for. A blocked job itself is not re-checked; call `blocked` only
      for a job that waits for capacity, not one that can never fit.
    """

    def __init__(self, capacity, held_total, policy: QueuePolicy | None = None, *, held_long=None):
        self.policy = policy or QueuePolicy()
        self.capacity = tuple(capacity)
        self.used = list(held_total)
        self.long_used = list(held_total if held_long is None else held_long)
        self.long_limit = tuple(c * (1 - self.policy.short_job_share) for c in self.capacity)
        self.long_waiting = [0.0] * len(self.capacity)  # the first long job refused for it
        self.reservations: list[_Reservation] = []
        self.reserved = [0.0] * len(self.capacity)
        # the head whose hold refused the last job `backfill_would_delay_head`
        self.blocker: _Reservation | None = None

    @classmethod
    def from_standings(cls, capacity, standings: dict, policy: QueuePolicy | None = None) -> Gate:
        """The gate over what the tenants of `standings` hold (`fairshare.standings`)."""
        held, held_long = [0.0] * len(capacity), [0.0] * len(capacity)
        for standing in standings.values():
            for r in range(len(capacity)):
                held[r] += standing.held[r]
                held_long[r] += standing.held_long[r]
        return cls(capacity, held, policy, held_long=held_long)

    def admits(self, job: QueuedJob) -> str:
        long = not self.policy.is_short(job.max_runtime_s)
        if (
            long
            and not _fits(job.demand, self.long_used, self.long_waiting, self.long_limit)
            and _fits(job.demand, self.used, self.reserved, self.capacity)
        ):  # room in the pool, not in the long jobs' part of it
            if not any(self.long_waiting):
                self.long_waiting = list(job.demand)
            return SHORT_SHARE_RESERVED
        if self.reservations and not _fits(job.demand, self.used, self.reserved, self.capacity):
            runtime = job.max_runtime_s
            for head in self.reservations:
                if runtime is None or head.start_s is None or runtime > head.start_s:
                    self.blocker = head
                    return BACKFILL_WOULD_DELAY_HEAD
        return ""

    def took(self, job: QueuedJob) -> None:
        long = not self.policy.is_short(job.max_runtime_s)
        for r, want in enumerate(job.demand):
            self.used[r] += want
            if long:
                self.long_used[r] += want

    def blocked(self, job: QueuedJob, earliest_start_s: float | None) -> None:
        if len(self.reservations) >= self.policy.backfill_reservations:
            return
        self.reservations.append(
            _Reservation(tuple(job.demand), earliest_start_s, job.id, job.tenant)
        )
        for r, want in enumerate(job.demand):
            self.reserved[r] += want


def _fits(want, used, set_aside, limit) -> bool:
    """`want` fits under `limit` beside `used` and what is `set_aside`, on each resource it
    asks for."""
    return all(
        w <= c - u - r + EPSILON
        for w, u, r, c in zip(want, used, set_aside, limit, strict=True)
        if w > 0
    )
