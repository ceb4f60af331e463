"""GPU fragmentation measured against a workload (the FGD measure, Weng et al., ATC'23).

A node's idle GPU capacity is a *fragment* for a typical request when that request could not
use it: the node lacks CPU (or memory) for it, the model is not allowed, too few devices fit, or
the capacity sits on devices with less free than the request needs per device. The expected
fragmentation ``F_n = sum_m p_m * f_n(m)`` weighs each typical request by its share of the
workload; a good placement is one that raises ``F`` the least.

``coupled_fragmentation`` couples the measure to the memory the node has left (the product
default's, ``plugins.fgd.memory_fgd``): typical request m can use at most
``floor(mem_free / mem_m) * k_m`` of the devices that fit it, the ones with the most free, and
the rest of the idle GPU is a fragment for m. ``mem_m`` is the mean memory of m's requests
(``Workload.with_mean_memory``).

``F`` depends on the node's free CPU and memory only through "is it below c_m" (coupled: "how
many copies of m fit"), so the value is memoised on (model, CPU band, memory band, sorted
free-milli per device): placing work on a node changes one key, and the same configurations
recur across thousands of nodes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Shape:
    """A typical request: CPU, memory, per-device milli-GPU, device count, allowed models."""

    cpu_millicores: int
    gpu_milli: int
    gpu_count: int
    models: frozenset[str] = frozenset()  # empty: any model
    memory_mib: int = 0


@dataclass(eq=False, slots=True)
class Workload:
    """Typical shapes with probabilities, plus the memo of node fragmentation values."""

    shapes: tuple[Shape, ...]
    probabilities: tuple[float, ...]
    _cpu_cuts: list[int] = field(init=False)
    _mem_cuts: list[int] = field(init=False)
    _memo: dict = field(init=False)
    _coupled_cuts: dict = field(init=False)  # device count -> memory levels
    _by_node: dict = field(init=False)  # (id(node), coupled) -> (node, value)
    _hostable_memo: dict = field(init=False)  # (model, CPU band, memory band) -> terms
    _p_cpu_only: float = field(init=False)
    _gpu_terms: list = field(init=False)
    pinned_models: frozenset[str] = field(init=False)  # models some typical shape is pinned to

    def __post_init__(self):
        self._cpu_cuts = sorted({s.cpu_millicores for s in self.shapes})
        self._mem_cuts = sorted({s.memory_mib for s in self.shapes})
        self._memo = {}
        self._coupled_cuts = {}
        self._by_node = {}
        self._hostable_memo = {}
        self.pinned_models = frozenset().union(*(s.models for s in self.shapes))
        # CPU-only shapes count every idle GPU; the others, as plain tuples ordered by per-device
        # milli, for the inner loop: (milli, count, cpu, mem, models, p).
        self._p_cpu_only = sum(
            p for s, p in zip(self.shapes, self.probabilities, strict=True) if not s.gpu_milli
        )
        self._gpu_terms = sorted(
            (s.gpu_milli, s.gpu_count, s.cpu_millicores, s.memory_mib, s.models, p)
            for s, p in zip(self.shapes, self.probabilities, strict=True)
            if s.gpu_milli
        )

    @classmethod
    def from_counts(cls, counts: Counter | dict, coverage: float = 0.95) -> Workload:
        """Keep the most frequent shapes covering ``coverage`` of requests (FGD's typical pods).

        Ties in count go to the larger shape tuple, as in the paper's simulator.
        """
        kept = _most_frequent(dict(counts), coverage)
        kept_total = sum(c for _, c in kept)
        return cls(tuple(s for s, _ in kept), tuple(c / kept_total for _, c in kept))

    @classmethod
    def from_shapes(cls, shapes: Iterable[Shape], coverage: float = 0.95) -> Workload:
        return cls.from_counts(Counter(shapes), coverage)

    @classmethod
    def with_mean_memory(cls, shapes: Iterable[Shape], coverage: float = 0.95) -> Workload:
        """FGD's typical requests (shapes apart from memory, the most frequent covering
        ``coverage``), each carrying the mean memory of its requests: the measure
        ``coupled_fragmentation`` couples to a node's free memory."""
        counts: Counter = Counter()
        memory: Counter = Counter()
        for s in shapes:
            key = replace(s, memory_mib=0)
            counts[key] += 1
            memory[key] += s.memory_mib
        kept = _most_frequent(counts, coverage)
        kept_total = sum(c for _, c in kept)
        return cls(
            tuple(replace(s, memory_mib=round(memory[s] / c)) for s, c in kept),
            tuple(c / kept_total for _, c in kept),
        )

    @classmethod
    def from_requests(cls, requests: Iterable, coverage: float = 0.95) -> Workload:
        """The mix of recent ``Request``s as the default policy measures it
        (``with_mean_memory``). A scheduling pass can attach it with ``policy.with_workload``."""
        return cls.with_mean_memory(
            (
                Shape(
                    r.cpu_millicores,
                    r.gpu_milli if r.gpu_count else 0,
                    r.gpu_count,
                    frozenset(r.gpu_models),
                    r.memory_mib,
                )
                for r in requests
            ),
            coverage,
        )

    def fragmentation(self, model: str, cpu: int, mem: int, frees: tuple[int, ...]) -> float:
        """Expected idle milli-GPU on a node that typical requests could not use."""
        frees = tuple(sorted(frees))
        key = (model, bisect_right(self._cpu_cuts, cpu), bisect_right(self._mem_cuts, mem), frees)
        value = self._memo.get(key)
        if value is None:
            value = self._remember(key, self._compute(model, cpu, mem, frees, False))
        return value

    def coupled_fragmentation(
        self, model: str, cpu: int, mem: int, frees: tuple[int, ...]
    ) -> float:
        """``fragmentation`` coupled to the node's free memory: a typical request m can use at
        most ``floor(mem / mem_m) * k_m`` of the devices that fit it (the ones with the most
        free), so idle GPU without the memory to run m on it counts as a fragment for m."""
        frees = tuple(sorted(frees))
        count = len(frees) - frees.count(0)  # only devices with room can take copies
        cuts = self._coupled_cuts.get(count)
        if cuts is None:
            cuts = self._coupled_cuts[count] = self._memory_cuts(count)
        # A negative memory band: never the key of ``fragmentation``.
        key = (model, bisect_right(self._cpu_cuts, cpu), -1 - bisect_right(cuts, mem), frees)
        value = self._memo.get(key)
        if value is None:
            value = self._remember(key, self._compute(model, cpu, mem, frees, True))
        return value

    def of_node(self, node, coupled: bool = False) -> float:
        """The fragmentation of ``node`` as it is (``coupled``: ``coupled_fragmentation``).

        Every request scored on a node starts from this value, so it is kept per node object:
        a ``NodeView`` is immutable (placing work makes a new one), and the entry holds the
        node, so its id cannot be reused while the entry lives.
        """
        key = (id(node), coupled)
        hit = self._by_node.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        measure = self.coupled_fragmentation if coupled else self.fragmentation
        frees = tuple(g.free_milli for g in node.gpus)
        value = measure(node.gpu_model, node.free_cpu_millicores, node.free_memory_mib, frees)
        if len(self._by_node) > 200_000:
            self._by_node.clear()
        self._by_node[key] = (node, value)
        return value

    def _memory_cuts(self, count: int) -> list[int]:
        """The free memory levels at which ``coupled_fragmentation`` changes on a node with
        ``count`` devices that have room: j copies of a typical request, for j up to the
        copies that could use every one of them."""
        cuts = set(self._mem_cuts)
        for _, k_m, _, mem_m, _, _ in self._gpu_terms:
            if mem_m:
                cuts.update(j * mem_m for j in range(1, -(-count // k_m) + 1))
        return sorted(cuts)

    def _remember(self, key: tuple, value: float) -> float:
        if len(self._memo) > 2_000_000:  # bound memory on very long runs
            self._memo.clear()
        self._memo[key] = value
        return value

    def _compute(
        self, model: str, cpu: int, mem: int, frees: tuple[int, ...], coupled: bool
    ) -> float:
        """``frees`` sorted ascending, so the devices that fit a request are a suffix."""
        total_free = sum(frees)
        if total_free == 0:
            return 0.0
        blocked, terms = self._hostable(model, cpu, mem)
        count = len(frees)
        # tail[i]: free milli on the devices frees[i:] (the count - i with the most free).
        tail = [0] * (count + 1)
        for i in range(count - 1, -1, -1):
            tail[i] = tail[i + 1] + frees[i]
        expected = blocked * total_free
        last_milli = fitting = -1
        for g_m, k_m, mem_m, p in terms:
            if g_m != last_milli:
                last_milli, fitting = g_m, count - bisect_left(frees, g_m)
            if fitting < k_m:
                expected += p * total_free
                continue
            usable = min(fitting, mem // mem_m * k_m) if coupled and mem_m else fitting
            expected += p * (total_free - tail[count - usable])
        return expected

    def _hostable(self, model: str, cpu: int, mem: int) -> tuple[float, list]:
        """(the probability of typical requests the node cannot host whatever its devices:
        CPU-only, too little CPU or memory, model not allowed; the terms of the others)."""
        key = (model, bisect_right(self._cpu_cuts, cpu), bisect_right(self._mem_cuts, mem))
        hit = self._hostable_memo.get(key)
        if hit is None:
            blocked, terms = self._p_cpu_only, []
            for g_m, k_m, c_m, mem_m, models_m, p in self._gpu_terms:
                if cpu < c_m or mem < mem_m or (models_m and model not in models_m):
                    blocked += p
                else:
                    terms.append((g_m, k_m, mem_m, p))
            hit = self._hostable_memo[key] = (blocked, terms)
        return hit


def _most_frequent(counts: dict, coverage: float) -> list[tuple[Shape, int]]:
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], _shape_key(kv[0])), reverse=True)
    kept, running = [], 0
    for shape, count in ordered:
        kept.append((shape, count))
        running += count
        if running >= coverage * total:
            break
    return kept


def _shape_key(shape: Shape) -> tuple:
    return (
        shape.cpu_millicores,
        shape.gpu_milli,
        shape.gpu_count,
        "|".join(sorted(shape.models)),
        shape.memory_mib,
    )


def generic_workload() -> Workload:
    """A neutral mix used when a policy has no measured workload: common shapes of GPU clusters."""
    shapes = [
        (Shape(4000, 250, 1), 0.15),
        (Shape(4000, 500, 1), 0.15),
        (Shape(8000, 1000, 1), 0.30),
        (Shape(16000, 1000, 2), 0.10),
        (Shape(32000, 1000, 4), 0.05),
        (Shape(64000, 1000, 8), 0.05),
        (Shape(8000, 0, 0), 0.20),
    ]
    return Workload(tuple(s for s, _ in shapes), tuple(p for _, p in shapes))
