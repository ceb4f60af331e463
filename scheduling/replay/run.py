"""One replay run: pods arrive one at a time and are placed by the production core
(``evaluate`` + ``apply_placement``) on ``NodeView`` snapshots; the GPU allocation curve and the
report over seeds.

Speed comes from caching, not from a second implementation:

* the evaluation of a pod shape on a node is kept per node signature (everything but the
  name), so identical nodes, and a node that comes back to a state seen before, are evaluated
  once per shape;
* the evaluation of each (pod shape, node) is cached and looked up again only for nodes whose
  capacity changed since that shape was last scored;
* pods never depart in this protocol, so capacity only shrinks and a node that cannot fit a
  shape never will again: it is not re-evaluated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

import numpy as np

from placement import apply_placement, evaluate, make_context
from placement.planner import to_placement
from placement.registry import random_scorer
from placement.types import NodeView, Policy, Request

from .policies import for_trace, policy_for
from .trace import Pod, build_arrivals, node_order, pod_request, read_nodes, read_pods
from .variants import make_variant

CURVE_MAX = 130


@dataclass(slots=True)
class _ShapeCache:
    request: Request
    scores: np.ndarray
    results: list
    by_signature: dict  # node signature -> evaluation of this shape
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
    policy: str | Policy,
    seed: int,
    tune: float = 1.3,
    progress: Callable[[int], None] | None = None,
    workload: dict | None = None,
) -> RunResult:
    """One replay: one trace, one policy (a name of ``POLICY_NAMES``, or a ``Policy`` such as
    a pool's), one seed. The policy's workload is measured from the trace (a ``Policy``'s as
    the product measures it, or with ``typical_workload`` options ``workload``)."""
    started = time.perf_counter()
    capacity = sum(1000 * len(n.gpus) for n in nodes)
    arrivals = build_arrivals(pods, seed, tune, capacity)
    if isinstance(policy, str):
        policy = policy_for(policy, pods, seed)
    else:
        policy = for_trace(policy, pods, seed, workload)
    nodes = node_order(nodes, seed)
    signatures = [_signature(n) for n in nodes]
    ctx = make_context(nodes, policy, rng=Random(seed + 7919))
    pick_random = random_scorer(policy)
    caches: dict[tuple, _ShapeCache] = {}
    change_log: list[int] = []
    allocated = 0
    arrived = 0
    failed = 0
    events: list[tuple[int, float]] = []
    failures: list[tuple[int, Pod]] = []
    for step, pod in enumerate(arrivals):
        cache = caches.get(pod.shape_key)
        if cache is None:
            cache = _new_cache(pod, nodes, signatures, ctx)
            caches[pod.shape_key] = cache
        else:
            _refresh(cache, nodes, signatures, ctx, change_log)
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
            placement = to_placement(cache.request, nodes[chosen], cache.results[chosen], policy)
            nodes[chosen] = apply_placement(nodes[chosen], placement)
            signatures[chosen] = _signature(nodes[chosen])
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


def _signature(node: NodeView) -> str:
    """Everything a replay node can differ in besides its name (``read_nodes`` sets the rest
    to defaults and ``apply_placement`` changes only these), so equal signatures evaluate
    equally. Many nodes are still untouched copies of a few machine types. A string, because
    a string keeps its hash: each signature is looked up once per pod shape."""
    return repr(
        (
            node.cpu_millicores,
            node.memory_mib,
            node.free_cpu_millicores,
            node.free_memory_mib,
            sorted(node.workload_labels),
            [(g.model, g.free_milli, g.tenants) for g in node.gpus],
        )
    )


def _new_cache(pod: Pod, nodes, signatures, ctx) -> _ShapeCache:
    request = pod_request(pod)
    scores = np.full(len(nodes), -np.inf)
    results: list = [None] * len(nodes)
    seen: dict[str, object] = {}
    for i, node in enumerate(nodes):
        key = signatures[i]
        result = seen.get(key)
        if result is None:
            result = evaluate(request, node, ctx)
            seen[key] = result
        if not isinstance(result, str):
            scores[i] = result.score
            results[i] = result
    return _ShapeCache(request, scores, results, seen)


def _refresh(cache: _ShapeCache, nodes, signatures, ctx, change_log: list[int]) -> None:
    scores, results, seen = cache.scores, cache.results, cache.by_signature
    for i in set(change_log[cache.log_position :]):
        if results[i] is None:  # never fitted; capacity only shrinks in a replay
            continue
        key = signatures[i]
        result = seen.get(key)
        if result is None:
            result = evaluate(cache.request, nodes[i], ctx, static_checked=True)
            seen[key] = result
        if isinstance(result, str):
            scores[i] = -np.inf
            results[i] = None
        else:
            scores[i] = result.score
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
    policy: str | Policy,
    seeds,
    tune: float = 1.3,
    progress: Callable[[int], None] | None = None,
    on_run: Callable[[RunResult], None] | None = None,
    variant: str = "",
) -> dict:
    """Replay ``pods_path`` on ``nodes_path`` once per seed; returns the ``summarize`` report
    (its ``policy`` is the name, or the ``Policy``'s name). ``variant``: replay each seed's
    resample of the trace (``variants.VARIANTS``) instead of the trace itself."""
    nodes = read_nodes(nodes_path)
    pods = read_pods(pods_path)
    runs = []
    for seed in seeds:
        trace_pods = make_variant(pods, variant, seed) if variant else pods
        runs.append(replay_run(nodes, trace_pods, policy, seed, tune, progress))
        if on_run:
            on_run(runs[-1])
    trace = pods_path.rsplit("/", 1)[-1].removesuffix(".csv") + (f"+{variant}" if variant else "")
    return summarize(trace, policy if isinstance(policy, str) else policy.name, runs)
