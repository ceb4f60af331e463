"""Replay of the OpenB GPU-cluster trace through the scheduler core (FGD paper protocol).

See ``../shared/benchmarks/openb/PROTOCOL.md``. Each pod is evaluated by ``planner.evaluate``
(the same filters, device choice and scorers as production) on ``NodeView`` snapshots updated by
``planner.apply_placement``. Speed comes from caching, not from a second implementation:

* static filters (GPU model) are evaluated once per (pod shape, node);
* the evaluation of each (pod shape, node) is cached and recomputed only for nodes whose
  capacity changed since that shape was last scored;
* pods never depart in this protocol, so capacity only shrinks and a node that cannot fit a
  shape never will again: it is not re-evaluated.

Node order: ties go to the smallest node name, but the paper's simulator renames every node
before the run with a random-permutation prefix (``syncClusterResourceList`` in
``pkg/simulator/simulator.go``: nodes sorted by name, then ``"%04d-" % perm[i] + name``), so the
tie order is a random permutation of the cluster drawn once per run, not the CSV order that
PROTOCOL.md describes. ``node_order`` does the same with a seeded RNG of its own. The policies
whose scores tie most (GpuClustering, GpuPacking: every CPU-only pod scores 0 everywhere) are
the ones this moves: in CSV order they pile CPU-only pods onto the first nodes of the file and
come out 0.6-1.2 points below the published means.
"""

from __future__ import annotations

import csv
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from random import Random

import numpy as np

from . import filters, planner
from .fragmentation import Shape, Workload
from .policies import policy_for
from .types import EXCLUSIVE, TIMESLICE, GpuView, NodeView, Policy, Request

CURVE_MAX = 130


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""

    @property
    def demand(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shape_key(self) -> tuple:
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)


def read_nodes(path: str) -> list[NodeView]:
    nodes = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            count = int(row["gpu"] or 0)
            model = row.get("model") or ""
            gpus = tuple(GpuView(i, model=model, sharing=TIMESLICE) for i in range(count))
            nodes.append(
                NodeView(
                    name=row["sn"],
                    cpu_millicores=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    gpus=gpus,
                )
            )
    return sorted(nodes, key=lambda n: n.name)


def read_pods(path: str) -> list[Pod]:
    with open(path, newline="") as handle:
        return [
            Pod(
                name=row["name"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"] or 0),
                num_gpu=int(row["num_gpu"] or 0),
                gpu_milli=int(row["gpu_milli"] or 0),
                gpu_spec=row.get("gpu_spec") or "",
            )
            for row in csv.DictReader(handle)
        ]


def pod_request(pod: Pod) -> Request:
    sharing = TIMESLICE if 0 < pod.gpu_milli < 1000 else EXCLUSIVE
    return Request(
        name=pod.name,
        cpu_millicores=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_count=pod.num_gpu,
        gpu_milli=pod.gpu_milli if pod.num_gpu else 1000,
        gpu_models=tuple(m for m in pod.gpu_spec.split("|") if m),
        sharing=sharing,
    )


def typical_workload(
    pods: list[Pod], with_memory: bool = False, coverage: float = 0.95
) -> Workload:
    """FGD's typical pods: shapes covering ``coverage`` of the original trace (before tuning).

    The paper uses 95% and ignores memory; the product default uses every shape, with memory.
    """
    counts = Counter(
        Shape(
            p.cpu_milli,
            p.gpu_milli,
            p.num_gpu,
            frozenset(m for m in p.gpu_spec.split("|") if m),
            p.memory_mib if with_memory else 0,
        )
        for p in pods
    )
    return Workload.from_counts(counts, coverage)


def node_order(nodes: list[NodeView], seed: int) -> list[NodeView]:
    """The run's nodes renamed as the paper's simulator does (``"%04d-" % perm[i] + name`` over
    the name-sorted list, ``perm`` a random permutation) and sorted by the new names."""
    ordered = sorted(nodes, key=lambda n: n.name)
    perm = list(range(len(ordered)))
    Random(f"node-order-{seed}").shuffle(perm)
    renamed = [replace(n, name=f"{perm[i]:04d}-{n.name}") for i, n in enumerate(ordered)]
    return sorted(renamed, key=lambda n: n.name)


def build_arrivals(pods: list[Pod], seed: int, tune: float, capacity_milli: int) -> list[Pod]:
    """Shuffle (seeded) and inflate or trim the trace to ``tune`` x the GPU capacity."""
    rng = Random(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    rng.shuffle(ordered)
    target = tune * capacity_milli
    total = sum(p.demand for p in ordered)
    if total < target:
        clones = []
        while True:
            pod = ordered[rng.randrange(len(ordered))]
            if total + pod.gpu_milli > target:  # the protocol checks per-GPU milli
                break
            clones.append(pod)
            total += pod.demand
        return ordered + clones
    alive = list(ordered)
    while total > target:
        victim = alive.pop(rng.randrange(len(alive)))
        total -= victim.demand
    return alive


@dataclass(slots=True)
class _ShapeCache:
    request: Request
    scores: np.ndarray
    results: list
    log_position: int = 0


@dataclass(slots=True)
class RunResult:
    seed: int
    curve: dict[int, float]
    failed_pods: int
    pods: int
    seconds: float
    events: list[tuple[int, float]] = field(default_factory=list)
    failures: list[tuple[int, Pod]] = field(default_factory=list)  # (arrival index, pod)


def replay_run(
    nodes: list[NodeView],
    pods: list[Pod],
    policy_name: str,
    seed: int,
    tune: float = 1.3,
    progress: Callable[[int], None] | None = None,
    policy: Policy | None = None,
) -> RunResult:
    """One replay: one trace, one policy (by name, or an explicit ``policy``), one seed."""
    started = time.perf_counter()
    capacity = sum(1000 * len(n.gpus) for n in nodes)
    arrivals = build_arrivals(pods, seed, tune, capacity)
    policy = policy or policy_for(policy_name, pods, seed)
    nodes = node_order(nodes, seed)
    ctx = planner.make_context(nodes, policy, rng=Random(seed + 7919))
    pick_random = "random" in policy.weights
    caches: dict[tuple, _ShapeCache] = {}
    change_log: list[int] = []
    count = len(nodes)
    allocated = 0
    arrived = 0
    failed = 0
    events: list[tuple[int, float]] = []
    failures: list[tuple[int, Pod]] = []
    for step, pod in enumerate(arrivals):
        cache = caches.get(pod.shape_key)
        if cache is None:
            cache = _new_cache(pod, nodes, policy, ctx, count)
            caches[pod.shape_key] = cache
        else:
            _refresh(cache, nodes, ctx, change_log)
        cache.log_position = len(change_log)
        scores = cache.scores
        if pick_random:
            feasible = np.flatnonzero(scores > -np.inf)
            chosen = int(feasible[ctx.rng.randrange(len(feasible))]) if len(feasible) else -1
        else:
            chosen = int(np.argmax(scores))  # first maximum = smallest node name
            if scores[chosen] == -np.inf:
                chosen = -1
        if chosen < 0:
            failed += 1
            failures.append((step, pod))
        else:
            placement = planner._placement(
                cache.request, nodes[chosen], cache.results[chosen], policy
            )
            nodes[chosen] = planner.apply_placement(nodes[chosen], placement)
            change_log.append(chosen)
            allocated += sum(d.milli for d in placement.devices)
        arrived += pod.demand
        events.append((round(100 * arrived / capacity), round(100 * allocated / capacity, 2)))
        if progress and step % 500 == 0:
            progress(step)
    return RunResult(
        seed=seed,
        curve=curve_from_events(events),
        failed_pods=failed,
        pods=len(arrivals),
        seconds=time.perf_counter() - started,
        events=events,
        failures=failures,
    )


def _signature(node: NodeView) -> tuple:
    """Everything a replay node can differ in besides its name (``read_nodes`` sets the rest
    to defaults and ``apply_placement`` changes only these), so equal signatures evaluate
    equally. Many nodes are still untouched copies of a few machine types."""
    return (
        node.cpu_millicores,
        node.memory_mib,
        node.free_cpu_millicores,
        node.free_memory_mib,
        node.workload_labels,
        tuple((g.model, g.free_milli, g.tenants) for g in node.gpus),
    )


def _new_cache(pod: Pod, nodes, policy, ctx, count: int) -> _ShapeCache:
    request = pod_request(pod)
    scores = np.full(count, -np.inf)
    results: list = [None] * count
    seen: dict[tuple, object] = {}
    for i, node in enumerate(nodes):
        key = _signature(node)
        result = seen.get(key)
        if result is None:
            result = filters.static_reason(request, node, policy) or planner.evaluate(
                request, node, ctx, static_checked=True
            )
            seen[key] = result
        if not isinstance(result, str):
            scores[i] = result[0]
            results[i] = result
    return _ShapeCache(request, scores, results)


def _refresh(cache: _ShapeCache, nodes, ctx, change_log: list[int]) -> None:
    scores, results = cache.scores, cache.results
    for i in set(change_log[cache.log_position :]):
        if results[i] is None:  # never fitted; capacity only shrinks in a replay
            continue
        result = planner.evaluate(cache.request, nodes[i], ctx, static_checked=True)
        if isinstance(result, str):
            scores[i] = -np.inf
            results[i] = None
        else:
            scores[i] = result[0]
            results[i] = result


def curve_from_events(events: list[tuple[int, float]]) -> dict[int, float]:
    """Mean allocation per integer arrival percentage; ±1 neighbours fill empty points."""
    by_x: dict[int, list[float]] = {}
    for x, y in events:
        by_x.setdefault(x, []).append(y)
    curve = {}
    for x in range(CURVE_MAX + 1):
        values = by_x.get(x)
        if not values:
            values = [y for dx in (-1, 0, 1) for y in by_x.get(x + dx, [])]
        if values:
            curve[x] = round(sum(values) / len(values), 2)
    return curve


def summarize(trace: str, policy_name: str, runs: list[RunResult]) -> dict:
    """The replay report: allocation at 100 and 130 over seeds, mean curve, failures, speed."""

    def stats(x: int) -> dict:
        values = [r.curve[x] for r in runs if x in r.curve]
        if not values:
            return {"mean": None, "min": None, "max": None}
        return {
            "mean": round(sum(values) / len(values), 3),
            "min": min(values),
            "max": max(values),
        }

    curve = {}
    for x in range(CURVE_MAX + 1):
        values = [r.curve[x] for r in runs if x in r.curve]
        curve[str(x)] = round(sum(values) / len(values), 2) if values else None
    seconds = [r.seconds for r in runs]
    return {
        "trace": trace,
        "policy": policy_name,
        "seeds": [r.seed for r in runs],
        "alloc_at": {"100": stats(100), "130": stats(130)},
        "curve": curve,
        "failed_pods": {str(r.seed): r.failed_pods for r in runs},
        "pods": {str(r.seed): r.pods for r in runs},
        "seconds_per_run": round(sum(seconds) / len(seconds), 3),
        "seconds": [round(s, 3) for s in seconds],
    }


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' or '42'."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = part.split("-", 1)
            seeds.extend(range(int(low), int(high) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def replay(
    nodes_path: str,
    pods_path: str,
    policy_name: str,
    seeds,
    tune: float = 1.3,
    progress: Callable[[int], None] | None = None,
    on_run: Callable[[RunResult], None] | None = None,
) -> dict:
    """Replay ``pods_path`` on ``nodes_path`` once per seed; returns the ``summarize`` report."""
    nodes = read_nodes(nodes_path)
    pods = read_pods(pods_path)
    runs = []
    for seed in seeds:
        runs.append(replay_run(nodes, pods, policy_name, seed, tune, progress))
        if on_run:
            on_run(runs[-1])
    trace = pods_path.rsplit("/", 1)[-1].removesuffix(".csv")
    return summarize(trace, policy_name, runs)


__all__ = [
    "Pod",
    "RunResult",
    "build_arrivals",
    "curve_from_events",
    "node_order",
    "parse_seeds",
    "read_nodes",
    "read_pods",
    "replay",
    "replay_run",
    "summarize",
    "typical_workload",
]
