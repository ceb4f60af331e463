"""Trace variants: mixes of the same cluster that are not in ``data/``, resampled from the given
traces, so that a policy is judged on more than the five mixes it could be tuned to.

The published family (PROTOCOL.md) has siblings of the given traces that are not given (cpu200,
gpushare60/80, multigpu30/40, gpuspec20/25). Each variant below is made from one base trace by
seeded resampling of the base's own rows: no new data, no new shapes except where said. The
base's pods keep their names; an added pod is named after the pod it copies plus ``-vN``.
``make_variant(pods, name, seed)`` is deterministic for a seed; the replay draws each run's
variant with the run's seed, so three seeds are three resamples.

* ``cpu20``, ``cpu40`` (base: default): every GPU pod kept; CPU-only pods drawn with
  replacement from the base's CPU-only pods and added until CPU-only pods are 20 % / 40 % of
  all pods (default: 13 %; the family's cpu200 is 20 %). CPU-only pods the base has are kept.
* ``share60``, ``share100`` (base: default): whole-GPU pods (one or several GPUs), in a seeded
  random order, each replaced by a sharing pod drawn with replacement from the base's sharing
  pods (its CPU, memory and milli-GPU; the replaced pod's name) until sharing pods carry 60 % /
  100 % of the GPU demand (default: about 25 %; the family's gpushare80 is 80 %). In
  ``share100`` every GPU pod shares a GPU.
* ``multigpu35`` (base: default): multi-GPU pods drawn with replacement from the base's
  multi-GPU pods and added until they carry 35 % of the GPU demand (default: 7 %; the family's
  multigpu40 is 40 %). Demand then exceeds 1.3 x capacity, and the tuning trims random pods.
* ``spec25`` (base: gpuspec10): unconstrained GPU pods, in a seeded random order, each given
  the model constraint (``gpu_spec``) of a constrained base pod with the same GPU count, drawn at
  random, until 25 % of GPU pods are constrained (gpuspec10: 10 %; the family's gpuspec25).
  A GPU count no constrained pod has stays unconstrained (its constraint could be infeasible).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from random import Random

from .trace import Pod


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    base: str  # the stem of the given trace it is built from, in the benchmark
    make: Callable[[list[Pod], Random], list[Pod]]


def _is_share(pod: Pod) -> bool:
    return pod.num_gpu == 1 and 0 < pod.gpu_milli < 1000


def _more_cpu_only(share: float):
    def make(pods: list[Pod], rng: Random) -> list[Pod]:
        cpu_only = [p for p in pods if p.num_gpu == 0]
        gpu_pods = len(pods) - len(cpu_only)
        wanted = round(share * gpu_pods / (1 - share))
        added = [_copy(rng.choice(cpu_only), i) for i in range(max(0, wanted - len(cpu_only)))]
        return pods + added

    return make


def _more_shared(share: float):
    def make(pods: list[Pod], rng: Random) -> list[Pod]:
        sharing = [p for p in pods if _is_share(p)]
        out = list(pods)
        whole = [i for i, p in enumerate(out) if p.num_gpu and not _is_share(p)]
        rng.shuffle(whole)
        shared = sum(p.demand for p in sharing)
        total = sum(p.demand for p in out)
        for i in whole:
            if shared >= share * total:
                break
            new = replace(rng.choice(sharing), name=out[i].name)
            total += new.demand - out[i].demand
            shared += new.demand
            out[i] = new
        return out

    return make


def _more_multi_gpu(share: float):
    def make(pods: list[Pod], rng: Random) -> list[Pod]:
        multi = [p for p in pods if p.num_gpu > 1]
        in_multi = sum(p.demand for p in multi)
        total = sum(p.demand for p in pods)
        added = []
        while in_multi < share * total:
            pod = _copy(rng.choice(multi), len(added))
            added.append(pod)
            in_multi += pod.demand
            total += pod.demand
        return pods + added

    return make


def _more_constrained(share: float):
    def make(pods: list[Pod], rng: Random) -> list[Pod]:
        specs: dict[int, list[str]] = {}
        for p in pods:
            if p.num_gpu and p.gpu_spec:
                specs.setdefault(p.num_gpu, []).append(p.gpu_spec)
        if not specs:
            raise ValueError("this variant needs a trace with model-constrained pods (gpuspec)")
        out = list(pods)
        gpu_pods = sum(1 for p in out if p.num_gpu)
        constrained = sum(1 for p in out if p.num_gpu and p.gpu_spec)
        free = [i for i, p in enumerate(out) if p.num_gpu and not p.gpu_spec]
        rng.shuffle(free)
        for i in free:
            if constrained >= share * gpu_pods:
                break
            choices = specs.get(out[i].num_gpu)
            if choices:
                out[i] = replace(out[i], gpu_spec=rng.choice(choices))
                constrained += 1
        return out

    return make


def _copy(pod: Pod, n: int) -> Pod:
    return replace(pod, name=f"{pod.name}-v{n}")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("cpu20", "openb_pod_list_default", _more_cpu_only(0.20)),
        Variant("cpu40", "openb_pod_list_default", _more_cpu_only(0.40)),
        Variant("share60", "openb_pod_list_default", _more_shared(0.60)),
        Variant("share100", "openb_pod_list_default", _more_shared(1.0)),
        Variant("multigpu35", "openb_pod_list_default", _more_multi_gpu(0.35)),
        Variant("spec25", "openb_pod_list_gpuspec10", _more_constrained(0.25)),
    )
}


def make_variant(pods: list[Pod], name: str, seed: int) -> list[Pod]:
    """The variant ``name`` of ``pods`` for ``seed`` (same inputs, same pods)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    return VARIANTS[name].make(list(pods), Random(f"variant-{name}-{seed}"))
