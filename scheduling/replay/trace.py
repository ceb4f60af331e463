"""The OpenB trace: its node and pod CSVs, the pods as core requests, the typical workload
measured from them, and the protocol's arrival order and node order."""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, replace
from random import Random

from placement.fragmentation import Shape, Workload
from placement.types import EXCLUSIVE, TIMESLICE, GpuView, NodeView, Request


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


def typical_workload(pods: list[Pod], memory: str = "none", coverage: float = 0.95) -> Workload:
    """FGD's typical pods: shapes covering ``coverage`` of the original trace (before tuning).

    ``memory``: "none" ignores it (the paper), "exact" makes it part of the shape, "mean" gives
    each shape the mean memory of its pods (the product default, ``Workload.with_mean_memory``).
    """
    shapes = [
        Shape(
            p.cpu_milli,
            p.gpu_milli,
            p.num_gpu,
            frozenset(m for m in p.gpu_spec.split("|") if m),
            0 if memory == "none" else p.memory_mib,
        )
        for p in pods
    ]
    if memory == "mean":
        return Workload.with_mean_memory(shapes, coverage)
    return Workload.from_counts(Counter(shapes), coverage)


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
