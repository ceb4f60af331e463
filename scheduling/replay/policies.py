"""The policies a replay can run by name: the product default and the six policies of the FGD
paper, and the typical workload each is measured against.

All are ``Policy`` values of the same core; the paper's differ from the default only in scorer
weights, device choice and integer truncation. The default is the core's ``DEFAULT_POLICY``,
the one a pool starts with.
"""

from __future__ import annotations

from dataclasses import replace

from placement import DEFAULT_POLICY, Policy

from .trace import Pod, typical_workload

PAPER_POLICIES: dict[str, Policy] = {
    "random": Policy(
        name="random", weights={"random": 1.0}, gpu_choice="random", integer_scores=True
    ),
    "dotprod": Policy(
        name="dotprod", weights={"paper_dotprod": 1.0}, gpu_choice="best_fit", integer_scores=True
    ),
    "gpu-clustering": Policy(
        name="gpu-clustering",
        weights={"paper_gpu_clustering": 1.0},
        gpu_choice="best_fit",
        integer_scores=True,
    ),
    "gpu-packing": Policy(
        name="gpu-packing",
        weights={"paper_gpu_packing": 1.0},
        gpu_choice="best_fit",
        integer_scores=True,
    ),
    "best-fit": Policy(
        name="best-fit", weights={"paper_best_fit": 1.0}, gpu_choice="best_fit", integer_scores=True
    ),
    "fgd": Policy(
        name="fgd", weights={"paper_fgd": 1.0}, gpu_choice="fragmentation", integer_scores=True
    ),
}

POLICY_NAMES = ("default", *PAPER_POLICIES)

# How a policy's typical workload is measured from a trace (``typical_workload`` options): the
# product's every shape with memory, the paper's the shapes covering 95 % without memory.
DEFAULT_WORKLOAD = {"memory": "mean", "coverage": 0.95}
PAPER_WORKLOAD = {"memory": "none", "coverage": 0.95}


def policy_for(name: str, trace_pods: list[Pod] | None = None, seed: int = 0) -> Policy:
    """The named policy, with its workload measured from ``trace_pods`` when given."""
    if name == "default":
        policy, workload = DEFAULT_POLICY, DEFAULT_WORKLOAD
    elif name in PAPER_POLICIES:
        policy, workload = PAPER_POLICIES[name], PAPER_WORKLOAD
    else:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    if trace_pods is None:
        return replace(policy, seed=seed)
    return for_trace(policy, trace_pods, seed, workload)


def for_trace(policy: Policy, trace_pods: list[Pod], seed: int, workload=None) -> Policy:
    """``policy`` for one replay run: its seed, and its workload measured from the trace the
    way the product measures it (``DEFAULT_WORKLOAD``) unless ``workload`` says otherwise."""
    options = DEFAULT_WORKLOAD if workload is None else workload
    return replace(policy, seed=seed, workload=typical_workload(trace_pods, **options))
