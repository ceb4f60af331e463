"""Quotas and credit: a tenant's caps in a pool, re-checked under the quota rows' locks in the
ledger's write (`recheck`), and read once per pass by the scheduler (`quota_headroom`,
`tenants_at_quota`).

Dimensions (docs/leases.md): held now — `leases`, `cpu_millicores`, `memory_mib`, `gpus` (a
GPU by its real share, `leases.models.gpu_share`) — refuse what would go over; accrued — per
period `gpu_hours` (only a request with GPUs), `egress_mib`, and `storage_mib` of the jobs'
outputs — refuse new work once used up, and what runs goes on. Every refusal names its
dimension (`QuotaRefused`). A credit account at or below zero refuses new work
(`credit_exhausted`); running work is not touched.

Whether a (tenant, pool) HAS a quota row or a credit account is configuration: cached per
process for a few seconds (a quota or account created or deleted takes effect within
QUOTA_CACHE_SECONDS in other processes, at once in this one). Usage against an existing quota
is always checked under the quota row's lock (`recheck`), never cached.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.db.models import Count, Q, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from leases.choices import HOLDING
from leases.models import Lease, gpu_share
from pools.models import CreditAccount, Quota
from pools.statemachine import TransitionRefused
from storage import services as volume_services

QUOTA_CACHE_SECONDS = 5.0
# pair → (when read, has a quota row, has a credit account)
_limited: dict[tuple[int, int], tuple[float, bool, bool]] = {}
MIB = 1024 * 1024
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
GPU_EPSILON = 1e-9  # seven 1/7 shares add up to 0.999…: compare GPUs with this slack

HELD = ("leases", "cpu_millicores", "memory_mib", "gpus")
ACCRUED = ("gpu_hours", "egress_mib", "storage_mib")
DIMENSIONS = HELD + ACCRUED


class QuotaRefused(TransitionRefused):
    """`quota_exceeded`, naming the first dimension it exceeds; the API body carries
    `dimension` beside `code` and `detail`."""

    def __init__(self, dimension: str, message: str):
        super().__init__("quota_exceeded", message)
        self.dimension = dimension
        self.extra = {"dimension": dimension}


class CreditExhausted(TransitionRefused):
    def __init__(self, message: str):
        super().__init__("credit_exhausted", message)


def explanation(refusal: TransitionRefused) -> dict:
    """A refusal as a job's pending_reason: {"code", "message"} and, for a quota, "dimension"."""
    return {"code": refusal.code, "message": refusal.message, **refusal.extra}


@receiver([post_save, post_delete], sender=Quota)
def _forget_quotas(sender, instance, **kwargs):
    _limited.clear()


@receiver([post_save, post_delete], sender=CreditAccount)
def _forget_accounts(sender, instance, created=True, **kwargs):
    if created:  # a balance change (every charge) leaves the cache alone
        _limited.clear()


def lock_quotas(pairs: set[tuple[int, int]]) -> None:
    """Row locks on the pairs' quota rows, in id order (the first locks of the ledger's write)."""
    tenants, pools = zip(*pairs, strict=True)
    quotas = Quota.objects.select_for_update().filter(tenant_id__in=tenants, pool_id__in=pools)
    list(quotas.order_by("id").values_list("id", flat=True))


def _limits_of(pairs: set[tuple[int, int]]) -> dict[tuple[int, int], tuple[bool, bool]]:
    """pair → (has a quota row, has a credit account), cached as described above."""
    now = time.monotonic()
    known = {pair: _limited.get(pair) for pair in pairs}
    if all(hit is not None and now - hit[0] < QUOTA_CACHE_SECONDS for hit in known.values()):
        return {pair: hit[1:] for pair, hit in known.items()}
    tenants, pools = zip(*pairs, strict=True)
    scope = {"tenant_id__in": set(tenants), "pool_id__in": set(pools)}
    rows = (
        Quota.objects.filter(**scope)
        .values_list("tenant_id", "pool_id", Value(1))
        .union(
            CreditAccount.objects.filter(**scope).values_list("tenant_id", "pool_id", Value(2)),
            all=True,
        )
    )
    if len(_limited) > 10_000:
        _limited.clear()
    found = {pair: (False, False) for pair in pairs}
    for tenant_id, pool_id, kind in rows:
        if (tenant_id, pool_id) in found:
            has_quota, has_account = found[(tenant_id, pool_id)]
            found[(tenant_id, pool_id)] = (has_quota or kind == 1, has_account or kind == 2)
    for pair, flags in found.items():
        _limited[pair] = (now, *flags)
    return found


def pairs_with_quota(pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The (tenant id, pool id) pairs that `recheck` must see: with a quota row or a credit
    account (cached as described above)."""
    return {pair for pair, flags in _limits_of(pairs).items() if any(flags)}


# --- what a tenant uses -----------------------------------------------------------------------


def quota_period(period_days: int, now) -> tuple[datetime, datetime]:
    """The current period of a quota: consecutive `period_days` counted from 1970-01-01 UTC."""
    length = timedelta(days=max(1, period_days))
    start = EPOCH + ((now - EPOCH) // length) * length
    return start, start + length


def quota_limits(quota: Quota | None) -> dict:
    if quota is None:
        return dict.fromkeys(DIMENSIONS)
    return {
        "leases": quota.max_leases,
        "cpu_millicores": quota.cpu_millicores,
        "memory_mib": quota.memory_mib,
        "gpus": quota.gpus,
        "gpu_hours": quota.gpu_hours_per_period,
        "egress_mib": quota.egress_mib,
        "storage_mib": quota.storage_mib,
    }


def _held_hours(row: dict, start, now) -> float:
    """Hours of [start, now] the lease held its capacity (from its reserve to its end)."""
    end = row["ended_at"] or (row["state_changed_at"] if row["state"] not in HOLDING else now)
    seconds = (min(end, now) - max(row["created_at"], start)).total_seconds()
    return max(0.0, seconds) / 3600


def usage(quotas: dict[tuple[int, int], Quota | None], now=None, *, every=False) -> dict:
    """(tenant id, pool id) → what the tenant uses of each dimension in the pool: held now
    (leases, CPU, memory, GPU shares of its holding leases, backfills too: a backfill borrows
    another lease's node capacity, but it is its own tenant's work), accrued in the quota's
    current period (GPU-hours held, egress measured by the agent, `net_tx_bytes`), and the
    jobs' stored outputs. An accrued dimension is read only where the quota limits it, unless
    `every` (for the quotas API)."""
    now = now or timezone.now()
    used = {pair: dict.fromkeys(DIMENSIONS, 0.0) for pair in quotas}
    if not quotas:
        return used
    tenants, pools = {t for t, _ in quotas}, {p for _, p in quotas}
    holding = Lease.objects.filter(
        state__in=HOLDING, tenant_id__in=tenants, pool_id__in=pools
    ).order_by()
    for row in holding.values("tenant_id", "pool_id").annotate(
        n=Count("id"), cpu=Sum("cpu_millicores"), memory=Sum("memory_mib")
    ):
        if (pair := (row["tenant_id"], row["pool_id"])) in used:
            used[pair].update(leases=row["n"], cpu_millicores=row["cpu"], memory_mib=row["memory"])
    gpu_rows = holding.exclude(gpu_allocations=[]).values_list(
        "tenant_id", "pool_id", "gpu_allocations"
    )
    for tenant_id, pool_id, allocations in gpu_rows:
        if (pair := (tenant_id, pool_id)) in used:
            used[pair]["gpus"] += gpu_share(allocations)

    def wanted(dimension):
        return {
            p for p, q in quotas.items() if every or (q and quota_limits(q)[dimension] is not None)
        }

    periods = {
        pair: quota_period(quota.period_days if quota else 30, now)[0]
        for pair, quota in quotas.items()
    }
    if timed := wanted("gpu_hours") | wanted("egress_mib"):
        overlapping = Lease.objects.filter(
            tenant_id__in={t for t, _ in timed},
            pool_id__in={p for _, p in timed},
            created_at__lt=now,
        ).filter(Q(ended_at__isnull=True) | Q(ended_at__gt=min(periods[p] for p in timed)))
        rows = overlapping.order_by().values(
            "tenant_id",
            "pool_id",
            "state",
            "state_changed_at",
            "created_at",
            "ended_at",
            "gpu_allocations",
            tx=KT("usage_peak__net_tx_bytes"),
        )
        for row in rows:
            pair = (row["tenant_id"], row["pool_id"])
            if pair not in timed:
                continue
            hours = _held_hours(row, periods[pair], now)
            if not hours and (row["ended_at"] or now) <= periods[pair]:
                continue  # ended before this period began
            if row["gpu_allocations"]:
                used[pair]["gpu_hours"] += gpu_share(row["gpu_allocations"]) * hours
            used[pair]["egress_mib"] += int(row["tx"] or 0) / MIB
    for pool_id in {p for _, p in wanted("storage_mib")}:
        tenant_ids = {t for t, p in wanted("storage_mib") if p == pool_id}
        for tenant_id, size in stored_bytes(pool_id, tenant_ids).items():
            used[(tenant_id, pool_id)]["storage_mib"] = size / MIB
    return used


def stored_bytes(pool_id: int, tenant_ids) -> dict[int, int]:
    """tenant id → bytes it stores in the pool: its jobs' outputs and its live persistent
    volumes (storage.services.stored_bytes, the one count of the `storage_mib` quota)."""
    return volume_services.stored_bytes(pool_id, tenant_ids)


def storage_left_mib(tenant_id: int, pool_id: int) -> float | None:
    """What the tenant's `storage_mib` quota in the pool has left after its stored outputs
    (None: no storage quota)."""
    quota = (
        Quota.objects.filter(tenant_id=tenant_id, pool_id=pool_id, storage_mib__isnull=False)
        .values_list("storage_mib", flat=True)
        .first()
    )
    if quota is None:
        return None
    return quota - stored_bytes(pool_id, [tenant_id])[tenant_id] / MIB


def check_storage(tenant_id: int, pool_id: int, size: int) -> None:
    """At an output's upload, inside its transaction: refuses (`storage_mib`) an output of
    `size` bytes that would take the tenant's stored outputs in the pool past its quota. Under
    the quota row's lock, so two uploads cannot both squeeze into the last megabytes."""
    quota = (
        Quota.objects.select_for_update()
        .filter(tenant_id=tenant_id, pool_id=pool_id, storage_mib__isnull=False)
        .values_list("storage_mib", flat=True)
        .first()
    )
    if quota is None:
        return
    after = (stored_bytes(pool_id, [tenant_id])[tenant_id] + size) / MIB
    if after > quota:
        raise QuotaRefused("storage_mib", f"Quota exceeded: storage_mib {after:.4g} > {quota}")


def _balances(pairs) -> dict[tuple[int, int], object]:
    tenants, pools = {t for t, _ in pairs}, {p for _, p in pairs}
    rows = CreditAccount.objects.filter(tenant_id__in=tenants, pool_id__in=pools)
    found = {(t, p): b for t, p, b in rows.values_list("tenant_id", "pool_id", "balance")}
    return {pair: found[pair] for pair in pairs if pair in found}


# --- refusing --------------------------------------------------------------------------------


def refusal(limits: dict, used: dict, wanted: dict) -> tuple[str, str]:
    """(dimension, message) of the first dimension one more lease of `wanted` would exceed —
    held: what it would hold over the limit; accrued: nothing left this period — or ("", "")."""
    over = []
    for name in HELD:
        limit = limits[name]
        if limit is not None and used[name] + wanted[name] > limit + GPU_EPSILON:
            over.append((name, f"{name} {used[name] + wanted[name]:g} > {limit:g}"))
    for name in ACCRUED:
        limit = limits[name]
        if limit is None or (name == "gpu_hours" and not wanted["gpus"]):
            continue
        if used[name] >= limit:
            period = "" if name == "storage_mib" else " this period"
            over.append((name, f"{name} {used[name]:.4g} of {limit:g} used{period}"))
    if not over:
        return "", ""
    return over[0][0], "Quota exceeded: " + ", ".join(message for _, message in over)


def credit_refusal(balance) -> str:
    if balance is None or balance > 0:
        return ""
    return (
        f"Credit exhausted: balance {balance:.2f} in this pool; running work goes on, new work "
        "waits for a top-up."
    )


def recheck(rows) -> dict:
    """Under the quota rows' locks (`ledger.apply`): each tenant's headroom in each pool, read
    afresh, takes the new leases (`lease_rows.Row`s) in order — a lease's GPUs by the
    `gpu_share` of its allocations; {row: its refusal} for those it cannot take."""
    by_pool: dict[int, list] = {}
    for row in rows:
        by_pool.setdefault(row.shared.pool.pk, []).append(row)
    refused = {}
    for pool_id, mine in by_pool.items():
        now = mine[0].shared.lease_values["created_at"]
        rooms = quota_headroom(pool_id, {row.tenant_id for row in mine}, now=now)
        for row in mine:
            room = rooms.get(row.tenant_id)
            if room is None:
                continue
            lease = row.lease
            over = room.take(
                cpu_millicores=lease["cpu_millicores"],
                memory_mib=lease["memory_mib"],
                gpus=gpu_share(lease["gpu_allocations"]),
            )
            if over:
                refused[row] = room.refusal(over)
    return refused


def tenants_at_quota(*, pool_id=None, tenant_id=None, now=None) -> dict[tuple[int, int], dict]:
    """(tenant id, pool id) → the explanation, for every tenant that can start nothing in the
    pool: no credit left (`credit_exhausted`), or no room in its quota for even the smallest
    lease (one more, of 1 millicore and 1 MiB and no GPU: every request asks at least that),
    or its egress or storage used up (`quota_exceeded` with the dimension). The scheduling pass
    skips their queued jobs without a placement attempt."""
    scope = {}
    if pool_id is not None:
        scope["pool_id"] = pool_id
    if tenant_id is not None:
        scope["tenant_id"] = tenant_id
    quotas = {(q.tenant_id, q.pool_id): q for q in Quota.objects.filter(**scope)}
    balances = {
        (t, p): b
        for t, p, b in CreditAccount.objects.filter(**scope).values_list(
            "tenant_id", "pool_id", "balance"
        )
    }
    blocked = {}
    for pair, balance in balances.items():
        if message := credit_refusal(balance):
            blocked[pair] = {"code": "credit_exhausted", "message": message}
    quotas = {pair: q for pair, q in quotas.items() if pair not in blocked}
    smallest = {"leases": 1, "cpu_millicores": 1, "memory_mib": 1, "gpus": 0}
    for pair, used in usage(quotas, now).items():
        dimension, message = refusal(quota_limits(quotas[pair]), used, smallest)
        if dimension:
            blocked[pair] = {"code": "quota_exceeded", "dimension": dimension, "message": message}
    return blocked


class Headroom:
    """What one tenant may still take in one pool, for a pass that plans many jobs before it
    writes any: `take` deducts a planned placement, or names the dimension it would exceed.
    Read once per pass (`quota_headroom`); the apply transaction re-checks under the quota
    row's lock, so a stale headroom can only make the pass too cautious, never over quota."""

    def __init__(self, quota: Quota | None, used: dict, balance=None):
        self.limits = quota_limits(quota)
        self.used = {name: float(used.get(name) or 0) for name in DIMENSIONS}
        self.balance = balance
        self.refused = ("", "")  # (code, dimension) of the last refusal of `take`

    def take(self, *, cpu_millicores: int, memory_mib: int, gpus: float) -> str:
        """ "" and deducted when it fits; otherwise the refusal message: no credit, or
        `quota_exceeded` naming every dimension it would exceed (nothing deducted). `gpus`: the
        placement's GPU share (`leases.models.gpu_share`)."""
        if message := credit_refusal(self.balance):
            self.refused = ("credit_exhausted", "")
            return message
        wanted = {"leases": 1, "cpu_millicores": cpu_millicores, "memory_mib": memory_mib}
        wanted["gpus"] = gpus
        dimension, message = refusal(self.limits, self.used, wanted)
        if dimension:
            self.refused = ("quota_exceeded", dimension)
            return message
        for name, amount in wanted.items():
            self.used[name] += amount
        return ""

    def refusal(self, message: str) -> TransitionRefused:
        """The last refusal of `take` as the refusal a reserve raises."""
        code, dimension = self.refused
        if code == "credit_exhausted":
            return CreditExhausted(message)
        return QuotaRefused(dimension, message)

    def explanation(self, message: str) -> dict:
        """The last refusal of `take` as a job's pending_reason."""
        code, dimension = self.refused
        reason = {"code": code or "quota_exceeded", "message": message}
        if dimension:
            reason["dimension"] = dimension
        return reason


def quota_headroom(pool_id: int, tenant_ids, now=None) -> dict[int, Headroom]:
    """tenant id → its Headroom in the pool, for the tenants that have a quota or a credit
    account there."""
    tenant_ids = set(tenant_ids)
    quotas = {
        (q.tenant_id, pool_id): q
        for q in Quota.objects.filter(pool_id=pool_id, tenant_id__in=tenant_ids)
    }
    balances = _balances({(t, pool_id) for t in tenant_ids})
    pairs = set(quotas) | set(balances)
    used = usage({pair: quotas.get(pair) for pair in pairs}, now)
    return {pair[0]: Headroom(quotas.get(pair), used[pair], balances.get(pair)) for pair in pairs}
