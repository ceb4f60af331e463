"""MIG profiles of A100 and H100 GPUs and their valid placements.

A MIG-enabled GPU has 8 memory slices (7 usable compute slices). A profile occupies a fixed
number of memory slices and may only start at the positions NVIDIA allows (e.g. a 3g profile
starts at slice 0 or 4). A placement is valid when its slice range does not overlap a slice
already carved on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .types import MigSlice, NodeView


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    slices: int  # memory slices occupied, out of 8
    starts: tuple[int, ...]  # valid start positions
    memory_mib: int
    compute_milli: int  # share of the device's compute, in milli-GPU (g/7)


def _profiles(memory_gib_per_slice: int) -> dict[str, MigProfile]:
    m = memory_gib_per_slice
    table = [
        (f"1g.{m}gb", 1, (0, 1, 2, 3, 4, 5, 6), m, 1),
        (f"1g.{2 * m}gb", 2, (0, 2, 4, 6), 2 * m, 1),
        (f"2g.{2 * m}gb", 2, (0, 2, 4), 2 * m, 2),
        (f"3g.{4 * m}gb", 4, (0, 4), 4 * m, 3),
        (f"4g.{4 * m}gb", 4, (0,), 4 * m, 4),
        (f"7g.{8 * m}gb", 8, (0,), 8 * m, 7),
    ]
    return {
        name: MigProfile(name, slices, starts, mem * 1024, g * 1000 // 7)
        for name, slices, starts, mem, g in table
    }


# A100 40GB uses 5 GB slices, A100/H100 80GB 10 GB slices, H100 94/96GB 12 GB, H200 18 GB.
_A100_40 = _profiles(5)
_X_80 = _profiles(10)
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _A100_40,
    "A100-80GB": _X_80,
    "H100-80GB": _X_80,
    "H100-94GB": _profiles(12),
    "H200-141GB": _profiles(18),
}


def profiles_for(model: str, memory_mib: int = 0) -> dict[str, MigProfile]:
    """Profiles a device supports, by its model name (and memory when the name is ambiguous)."""
    if model in MIG_PROFILES:
        return MIG_PROFILES[model]
    upper = model.upper()
    if "A100" in upper:
        return _A100_40 if 0 < memory_mib <= 41 * 1024 or "40" in upper else _X_80
    if "H100" in upper or "H200" in upper or "H800" in upper or "A30" in upper:
        return _X_80 if "A30" not in upper else _profiles(6)
    return {}


def occupied_slices(slices, profiles: dict[str, MigProfile]) -> set[int]:
    used: set[int] = set()
    for s in slices:
        profile = profiles.get(s.profile)
        size = profile.slices if profile else 1
        used.update(range(s.start, s.start + size))
    return used


def free_starts(profile: MigProfile, used: set[int]) -> list[int]:
    """Valid start positions for ``profile`` that do not overlap ``used`` slices."""
    return [
        start
        for start in profile.starts
        if start + profile.slices <= 8
        and not used.intersection(range(start, start + profile.slices))
    ]


def layout_starts(profile: MigProfile, used: set[int], layout) -> list[int]:
    """Where a slice of ``profile`` can be placed on a device: with the device's real layout
    (``layout``: the MIG instances its agent reported through NVML, each a profile and start)
    only at an instance of that profile whose slices are free; without one (an agent that does
    not report placements: None) at any valid free start, as if instances were carved to
    order."""
    free = free_starts(profile, used)
    if layout is None:
        return free
    carved = {s.start for s in layout if s.profile == profile.name}
    return [start for start in free if start in carved]


# --------------------------------------------------------------------------- the layout plan
#
# Which idle MIG GPUs to carve anew, and into what, for the slices queued work waits for
# (docs/scheduler.md "MIG", the layout plan). Pure: scheduling/mig_plan.py reads the demand and
# the GPUs and asks nodes.services.mig for the layouts chosen. UNVERIFIED ON HARDWARE.


@dataclass(frozen=True, slots=True)
class MigWait:
    """Queued work that waits because no free instance of its profile is carved: `slices`
    instances of `profile` (a job's gpu_count), waiting for `waited_s` seconds; `models`: the
    GPU models it accepts (empty: any)."""

    profile: str
    slices: int = 1
    waited_s: float = 0.0
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A MIG-mode GPU as the plan sees it. `layout`: the instances its agent reported (None: not
    known, as from an agent that reports no placements; never planned). `used`: the memory
    slices leases hold; `idle`: no lease at all on it. `since_request_s`: seconds since the
    newest layout asked of it (None: never); `requested`: that layout while the GPU has not
    reported it (None: nothing pending)."""

    uuid: str
    model: str
    memory_mib: int = 0
    layout: tuple[MigSlice, ...] | None = None
    used: frozenset[int] = frozenset()
    idle: bool = True
    since_request_s: float | None = None
    requested: tuple[MigSlice, ...] | None = None


@dataclass(frozen=True, slots=True)
class LayoutChoice:
    """The layout asked of one GPU, and the waiting slices it serves (profile → count)."""

    uuid: str
    layout: tuple[MigSlice, ...]
    serves: dict[str, int]


@dataclass(frozen=True, slots=True)
class LayoutRules:
    max_gpus: int = 2  # GPUs asked for another layout per plan (a pool's, each run)
    min_wait_s: float = 60.0  # hysteresis: a younger wait does not count
    settle_s: float = 600.0  # a GPU asked for a layout this recently is left alone
    pending_trust_s: float = 600.0  # a layout asked and not reported counts as coming this long


def carvable(nodes: list[NodeView]) -> list[NodeView]:
    """The nodes with every MIG device's layout unknown (any valid start, as if carved to
    order): what a pool whose layout plan may carve any layout on an idle GPU can ever hold
    (leases.services.reserve's "never fits")."""
    return [
        replace(node, gpus=tuple(replace(g, mig_layout=None) for g in node.gpus))
        if any(g.mig_layout is not None for g in node.gpus)
        else node
        for node in nodes
    ]


_LAYOUTS: dict[tuple[str, int], tuple[tuple[MigSlice, ...], ...]] = {}


def valid_layouts(model: str, memory_mib: int = 0) -> tuple[tuple[MigSlice, ...], ...]:
    """Every non-empty layout a device of `model` can hold: instances of its profiles at their
    valid starts, none overlapping, each layout sorted by start (hundreds: 8 memory slices)."""
    key = (model, memory_mib)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    profiles = sorted(profiles_for(model, memory_mib).values(), key=lambda p: p.name)
    out: list[tuple[MigSlice, ...]] = []

    def walk(slot: int, chosen: tuple[MigSlice, ...]) -> None:
        if slot >= 8:
            if chosen:
                out.append(chosen)
            return
        walk(slot + 1, chosen)  # this memory slice stays uncarved
        for p in profiles:
            if slot in p.starts and slot + p.slices <= 8:
                walk(slot + p.slices, (*chosen, MigSlice(p.name, slot)))

    walk(0, ())
    _LAYOUTS[key] = tuple(out)
    return _LAYOUTS[key]


Unmet = dict[tuple[str, tuple[str, ...]], int]  # (profile, models accepted) → slices waiting


def _take(unmet: Unmet, model: str, profile: str, n: int = 1) -> int:
    """Up to `n` waiting slices of `profile` a GPU of `model` may serve leave the demand; how
    many did."""
    taken = 0
    for key in sorted(unmet):
        p, models = key
        if taken >= n:
            break
        if p == profile and unmet[key] > 0 and (not models or model in models):
            k = min(unmet[key], n - taken)
            unmet[key] -= k
            taken += k
    return taken


def _wanted(unmet: Unmet, gpu: MigGpu) -> dict[str, int]:
    """The waiting slices a GPU could serve, per profile of its model."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    wanted: dict[str, int] = {}
    for (p, models), n in unmet.items():
        if n > 0 and p in profiles and (not models or gpu.model in models):
            wanted[p] = wanted.get(p, 0) + n
    return wanted


def _free(gpu: MigGpu) -> list[str]:
    """Profiles of the GPU's reported instances no lease holds."""
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    free = []
    for s in gpu.layout or ():
        size = profiles[s.profile].slices if s.profile in profiles else 1
        if not gpu.used.intersection(range(s.start, s.start + size)):
            free.append(s.profile)
    return free


def _score(layout: tuple[MigSlice, ...], wanted: dict[str, int], current, profiles) -> tuple:
    """Lexicographic: the waiting compute it serves, the instances it keeps of the current
    layout, the compute it carves in waiting profiles, the compute it carves, fewer
    instances; last the layout itself (a deterministic choice)."""
    counts: dict[str, int] = {}
    for s in layout:
        counts[s.profile] = counts.get(s.profile, 0) + 1
    served = sum(min(n, wanted.get(p, 0)) * profiles[p].compute_milli for p, n in counts.items())
    kept = sum(1 for s in layout if (s.profile, s.start) in current)
    waiting = sum(profiles[s.profile].compute_milli for s in layout if s.profile in wanted)
    carved = sum(profiles[s.profile].compute_milli for s in layout)
    return (served, kept, waiting, carved, -len(layout), [(s.start, s.profile) for s in layout])


def _settled(gpu: MigGpu, waiting: set[str], rules: LayoutRules) -> bool:
    """Whether the plan may choose another layout for the GPU."""
    return (
        gpu.idle
        and not gpu.used
        and gpu.layout is not None
        and gpu.requested is None
        and (gpu.since_request_s is None or gpu.since_request_s >= rules.settle_s)
        and not any(s.profile in waiting for s in gpu.layout)  # it serves the demand already
        and bool(profiles_for(gpu.model, gpu.memory_mib))
    )


def plan_layouts(
    demand: list[MigWait], gpus: list[MigGpu], rules: LayoutRules | None = None
) -> list[LayoutChoice]:
    """For at most `rules.max_gpus` idle GPUs, the valid layout that serves the waiting MIG
    slices best (docs/scheduler.md, "MIG", the layout plan):

    1. demand: the waits of at least `min_wait_s`, in slices per profile (and models accepted);
    2. less what serves it already or is on its way: each free reported instance of the pool's
       GPUs, and each instance of a layout asked of a GPU that has not reported it yet (for
       `pending_trust_s` after the ask; past that, the GPU's reported free instances count);
    3. candidates: idle GPUs with a known layout, nothing pending, not asked within
       `settle_s`, and no instance of a waiting profile in their layout;
    4. at most `max_gpus` times: the candidate and valid layout of its model with the best
       score (`_score`), taken only when it serves a waiting slice; what it serves leaves the
       demand. GPUs in the given order break ties.

    Never a GPU with a lease; nothing without demand that waited long enough."""
    rules = rules or LayoutRules()
    unmet: Unmet = {}
    for wait in demand:
        if wait.waited_s >= rules.min_wait_s and wait.slices > 0:
            key = (wait.profile, tuple(sorted(wait.models)))
            unmet[key] = unmet.get(key, 0) + wait.slices
    if not unmet or rules.max_gpus <= 0:
        return []
    waiting = {p for p, _ in unmet}
    for gpu in gpus:
        pending = gpu.requested is not None and (
            gpu.since_request_s is None or gpu.since_request_s < rules.pending_trust_s
        )
        coming = [s.profile for s in gpu.requested] if pending else _free(gpu)
        for profile in coming:
            _take(unmet, gpu.model, profile)
    candidates = [gpu for gpu in gpus if _settled(gpu, waiting, rules)]
    chosen: list[LayoutChoice] = []
    while candidates and len(chosen) < rules.max_gpus and any(unmet.values()):
        best = None
        scored: dict[tuple, tuple] = {}  # GPUs alike (model, layout) score alike: once each
        for position, gpu in enumerate(candidates):
            current = frozenset((s.profile, s.start) for s in gpu.layout)
            key = (gpu.model, gpu.memory_mib, current)
            if key not in scored:
                wanted = _wanted(unmet, gpu)
                profiles = profiles_for(gpu.model, gpu.memory_mib)
                scored[key] = max(
                    ((_score(layout, wanted, current, profiles), layout)
                     for layout in valid_layouts(gpu.model, gpu.memory_mib)),
                    default=None,
                )  # fmt: skip
            if scored[key] is None or scored[key][0][0] <= 0:
                continue
            if best is None or scored[key][0] > best[0]:
                best = (scored[key][0], scored[key][1], position)
        if best is None:
            break
        _, layout, position = best
        gpu = candidates.pop(position)
        serves: dict[str, int] = {}
        for s in layout:
            if _take(unmet, gpu.model, s.profile):
                serves[s.profile] = serves.get(s.profile, 0) + 1
        chosen.append(LayoutChoice(gpu.uuid, layout, serves))
    return chosen
