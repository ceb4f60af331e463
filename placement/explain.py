"""Why a request fits nowhere: rejected nodes counted per reason, the nearest miss (what the
closest node lacks), and when ending leases would make room (only the requester's own leases
are named, and only their ends are told exactly: where another tenant's lease must end first,
the text says `FREES_UP` and the adapter, which knows the time, adds a coarse window)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from . import reasons as r
from .context import ScoreContext, make_context
from .devices import usable_memory_mib
from .evaluation import evaluate
from .mig import occupied_slices, profiles_for
from .types import EXCLUSIVE, Explanation, GpuView, LeaseEnd, NearMiss, NodeView, Request

_GIB = 1024


_CAPACITY = frozenset(
    {r.INSUFFICIENT_CPU, r.INSUFFICIENT_MEMORY, r.INSUFFICIENT_SCRATCH}
    | {r.GPU_MEMORY_TOO_SMALL, r.INSUFFICIENT_GPU}
)


def _lacking(req: Request, node: NodeView, reason: str) -> dict[str, int] | None:
    """Everything a node rejected for capacity lacks, GPU count first (a 2-GPU node is no near
    miss for 64 GPUs, whatever its memory); None when the rejection is not about capacity."""
    if reason not in _CAPACITY or (reason == r.INSUFFICIENT_GPU and not node.gpus):
        return None
    lacking = {}
    if req.wants_gpu:
        needed = max(req.gpu_count, 1)
        whole = req.gpu_milli >= 1000 or req.sharing == EXCLUSIVE
        if needed > len(node.gpus):
            lacking["gpus"] = needed - len(node.gpus)
        if req.gpu_memory_mib:
            biggest = max((usable_memory_mib(g, req) for g in node.gpus), default=0)
            if biggest < req.gpu_memory_mib:
                lacking["gpu_memory_mib"] = req.gpu_memory_mib - biggest
        if reason == r.INSUFFICIENT_GPU and "gpus" not in lacking:
            if whole:
                lacking["gpus"] = needed - sum(1 for g in node.gpus if g.is_free)
            else:
                lacking["gpu_milli"] = req.gpu_milli - max(g.free_milli for g in node.gpus)
    for dim, want, free in (
        ("cpu_millicores", req.cpu_millicores, node.free_cpu_millicores),
        ("memory_mib", req.memory_mib, node.free_memory_mib),
        ("scratch_mib", req.scratch_mib, node.free_scratch_mib),
    ):
        if want > free:
            lacking[dim] = want - free
    return {dim: amount for dim, amount in lacking.items() if amount > 0} or None


_SCALE = {
    "cpu_millicores": 1000,
    "memory_mib": 4 * _GIB,
    "scratch_mib": 16 * _GIB,
    "gpu_memory_mib": 4 * _GIB,
    "gpus": 1,
    "gpu_milli": 250,
}


def _describe(lacking: dict[str, int]) -> str:
    parts = []
    for dim, amount in lacking.items():
        if dim == "cpu_millicores":
            parts.append(f"{amount / 1000:g} fewer CPU cores")
        elif dim in ("memory_mib", "scratch_mib", "gpu_memory_mib"):
            label = {
                "memory_mib": "memory",
                "scratch_mib": "scratch",
                "gpu_memory_mib": "GPU memory",
            }
            parts.append(f"{math.ceil(amount / _GIB)} GiB less {label[dim]}")
        elif dim == "gpus":
            parts.append(f"{amount} fewer GPU{'s' if amount > 1 else ''}")
        else:
            parts.append(f"{amount} milli-GPU less")
    return " and ".join(parts)


# Rejections that ending leases can cure (they are about capacity in use, not about the node).
_WAITABLE = frozenset(
    {
        r.INSUFFICIENT_CPU,
        r.INSUFFICIENT_MEMORY,
        r.INSUFFICIENT_SCRATCH,
        r.INSUFFICIENT_GPU,
        r.TENANT_MIXING_REFUSED,
        r.NUMA_UNAVAILABLE,
        r.INTERCONNECT_UNAVAILABLE,
    }
)


def without_leases(node: NodeView, leases) -> NodeView:
    """The node once ``leases`` have ended and given their capacity back."""
    freed_milli: dict[int, int] = {}
    freed_slots: dict[int, int] = {}
    for lease in leases:
        for index, milli in lease.gpu_milli:
            freed_milli[index] = freed_milli.get(index, 0) + milli
        for index, mask in lease.mig_slots:
            freed_slots[index] = freed_slots.get(index, 0) | mask
    gpus = []
    for g in node.gpus:
        if g.index in freed_slots:
            gpus.append(_without_mig_slots(g, freed_slots[g.index]))
            continue
        extra = freed_milli.get(g.index, 0)
        if not extra:
            gpus.append(g)
            continue
        free = min(1000, g.free_milli + extra)
        gpus.append(replace(g, free_milli=free, tenants=() if free >= 1000 else g.tenants))
    return replace(
        node,
        free_cpu_millicores=node.free_cpu_millicores + sum(x.cpu_millicores for x in leases),
        free_memory_mib=node.free_memory_mib + sum(x.memory_mib for x in leases),
        free_scratch_mib=node.free_scratch_mib + sum(x.scratch_mib for x in leases),
        gpus=tuple(gpus),
    )


def _without_mig_slots(gpu: GpuView, mask: int) -> GpuView:
    """A MIG device once the slices covering ``mask``'s memory slices are destroyed."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    kept = tuple(s for s in gpu.mig_slices if not occupied_slices((s,), profiles) & _bits(mask))
    carved = len(occupied_slices(kept, profiles))
    return replace(gpu, mig_slices=kept, free_milli=max(0, 1000 - 125 * carved))


def _bits(mask: int) -> set[int]:
    return {bit for bit in range(8) if mask >> bit & 1}


def fits_after_leases(req: Request, node: NodeView, ctx: ScoreContext):
    """(end time, leases) of the earliest set of this node's leases whose end makes room for
    ``req`` (leases end in order of ``ends_at``), or None when even all of them do not."""
    ordered = sorted(node.leases, key=lambda x: (x.ends_at, x.lease_id))
    for count in range(1, len(ordered) + 1):
        if count < len(ordered) and ordered[count].ends_at == ordered[count - 1].ends_at:
            continue  # leases ending at the same moment free their capacity together
        ended = ordered[:count]
        if isinstance(evaluate(req, without_leases(node, ended), ctx), str):
            continue
        # Name only the leases that matter: drop earlier ones the request does not need.
        needed = list(ended)
        for lease in ended[:-1]:
            trial = [x for x in needed if x is not lease]
            if not isinstance(evaluate(req, without_leases(node, trial), ctx), str):
                needed = trial
        return ended[-1].ends_at, tuple(needed)
    return None


FREES_UP = "when capacity frees up"
# Coarse windows (seconds from now → words) for a wait that depends on another tenant's lease:
# its end is not the requester's business, so an explanation never tells it more exactly.
COARSE_WINDOWS = ((3600, "within the hour"), (4 * 3600, "in 1–4 hours"), (86400, "in 4–24 hours"))
BEYOND_WINDOWS = "in more than a day"


def coarse_window(seconds: float) -> str:
    """The coarse window a wait of `seconds` falls in."""
    for bound, words in COARSE_WINDOWS:
        if seconds < bound:
            return words
    return BEYOND_WINDOWS


def coarse_floor(seconds: float | None) -> float | None:
    """The lower bound of the coarse window `seconds` falls in: all that may be told of when
    another tenant's work frees capacity, as a bound that surely holds."""
    if seconds is None:
        return None
    floor = 0.0
    for bound, _ in COARSE_WINDOWS:
        if seconds < bound:
            return floor
        floor = bound
    return floor


def _when(moment) -> str:
    if hasattr(moment, "strftime"):
        offset = moment.utcoffset() if hasattr(moment, "utcoffset") else None
        suffix = " UTC" if offset is not None and not offset else ""
        return f"{moment:%Y-%m-%d %H:%M}{suffix}"
    return str(moment)


def _wait_text(needed: tuple[LeaseEnd, ...], moment, tenant: str) -> tuple[str, tuple[str, ...]]:
    """The wait and the lease ids it may name: only the requester's own. Another tenant's
    leases, and when each of them ends, are not its business: the text says no time at all
    (`FREES_UP`), the adapter adds a coarse window (leases.explain)."""
    own = tuple(x.lease_id for x in needed if not x.tenant or x.tenant == tenant)
    when = _when(moment)
    if len(own) < len(needed):
        yours = ""
        if own:
            yours = f" (your lease{'s' if len(own) > 1 else ''} {', '.join(own)} among them)"
        return f"{FREES_UP}{yours}", own
    if len(own) == 1:
        return f"when lease {own[0]} ends at {when}", own
    return f"when leases {', '.join(own)} have ended ({when})", own


def _earliest_wait(req, nodes, rejected, policy):
    """(end time, node, leases) for the node that frees room for ``req`` first, or None."""
    ctx = None
    best = None
    for node in nodes:
        if not node.leases or rejected.get(node.name) not in _WAITABLE:
            continue
        ctx = ctx or make_context(nodes, policy)
        found = fits_after_leases(req, node, ctx)
        if found and (best is None or found[0] < best[0]):
            best = (found[0], node, found[1])
    return best


def explain(req, nodes, rejected, policy, message="", reasons=None) -> Explanation:
    """Why ``req`` was placed nowhere: counts per reason (``rejected``: node name -> reason),
    the nearest miss, and when ending leases would make room."""
    counts = Counter(rejected.values()) if reasons is None else Counter(reasons)
    nearest = None
    for node in nodes:
        reason = rejected.get(node.name)
        if reason is None:
            continue
        lacking = _lacking(req, node, reason)
        if not lacking or min(lacking.values()) <= 0:
            continue
        distance = sum(v / _SCALE[k] for k, v in lacking.items())
        if nearest is None or distance < nearest[0]:
            nearest = (distance, node, reason, lacking)
    wait = _earliest_wait(req, nodes, rejected, policy) if rejected else None
    near = None
    if nearest:
        _, node, reason, lacking = nearest
        text = f"would fit on {node.name} with {_describe(lacking)}"
        near = NearMiss(node.name, reason, lacking, text)
    if wait:
        moment, wait_node, needed = wait
        waiting, lease_ids = _wait_text(needed, moment, req.tenant)
        exact = len(lease_ids) == len(needed)  # only the requester's own leases must end
        if near is None:
            text = f"would fit on {wait_node.name} {waiting}"
            lacking = _lacking(req, wait_node, rejected[wait_node.name]) or {}
            near = NearMiss(wait_node.name, rejected[wait_node.name], lacking, text)
        elif wait_node.name == near.node:
            text = f"{near.message}, or {waiting}"
        else:
            text = f"{near.message}, or on {wait_node.name} {waiting}"
        near = replace(
            near,
            message=text,
            fits_at=moment,
            fits_exact=exact,
            fits_on=wait_node.name,
            after_leases=lease_ids,
        )
    if not message:
        summary = ", ".join(f"{n} {code}" for code, n in counts.most_common())
        message = f"0 of {len(nodes)} nodes: {summary}" if summary else f"0 of {len(nodes)} nodes"
        if near:
            message += f"; {near.message}"
    return Explanation(
        total_nodes=len(nodes),
        reasons=dict(counts.most_common()),
        nearest_miss=near,
        policy_version=policy.version,
        message=message,
    )
