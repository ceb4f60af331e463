"""GPU fragmentation measured against a workload (the FGD measure, Weng et al., ATC'23).

A node's idle GPU capacity is a *fragment* for a typical request when that request could not
use it: the node lacks CPU (or memory) for it, the model is not allowed, too few devices fit, or
the capacity sits on devices with less free than the request needs per device. The expected
fragmentation ``F_n = sum_m p_m * f_n(m)`` weighs each typical request by its share of the
workload; a good placement is one that raises ``F`` the least.

``F`` depends on the node's free CPU and memory only through "is it below c_m", so the value is
memoised on (model, CPU band, memory band, sorted free-milli per device): placing work on a node
changes one key, and the same configurations recur across thousands of nodes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


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
    _by_band: list = field(init=False)
    pinned_models: frozenset[str] = field(init=False)  # models some typical shape is pinned to

    def __post_init__(self):
        self._cpu_cuts = sorted({s.cpu_millicores for s in self.shapes})
        self._mem_cuts = sorted({s.memory_mib for s in self.shapes})
        self._memo = {}
        self.pinned_models = frozenset().union(*(s.models for s in self.shapes))
        # Terms as plain tuples for the inner loop: (cpu, mem, milli, count, models, p).
        self._by_band = [
            (s.cpu_millicores, s.memory_mib, s.gpu_milli, s.gpu_count, s.models, p)
            for s, p in zip(self.shapes, self.probabilities, strict=True)
        ]

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
    def from_requests(cls, requests: Iterable, coverage: float = 1.0) -> Workload:
        """The mix of recent ``Request``s, as the default policy measures it (all shapes,
        memory included). A scheduling pass can attach it with ``policy.with_workload``."""
        return cls.from_shapes(
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
        key = (
            model,
            bisect_right(self._cpu_cuts, cpu),
            bisect_right(self._mem_cuts, mem),
            tuple(sorted(frees)),
        )
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > 2_000_000:  # bound memory on very long runs
                self._memo.clear()
            value = self._compute(model, cpu, mem, key[3])
            self._memo[key] = value
        return value

    def _compute(self, model: str, cpu: int, mem: int, frees: tuple[int, ...]) -> float:
        total_free = sum(frees)
        if total_free == 0:
            return 0.0
        expected = 0.0
        for c_m, mem_m, g_m, k_m, models_m, p in self._by_band:
            if g_m == 0 or cpu < c_m or mem < mem_m or (models_m and model not in models_m):
                expected += p * total_free
                continue
            fitting = 0
            stranded = 0
            for r in frees:
                if r >= g_m:
                    fitting += 1
                else:
                    stranded += r
            expected += p * (total_free if fitting < k_m else stranded)
        return expected


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
