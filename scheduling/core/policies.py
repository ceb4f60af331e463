"""Named policies: the product default and the six policies of the FGD paper.

All are ``Policy`` values of the same core; they differ only in scorer weights, device choice and
integer truncation. ``policy_for(name, trace_pods, seed)`` attaches the workload distribution
used by the fragmentation scorer (FGD's "typical pods").
"""

from __future__ import annotations

from .types import Policy

DEFAULT_POLICY_VERSION = 1

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

DEFAULT_POLICY = Policy(
    name="default",
    version=DEFAULT_POLICY_VERSION,
    weights={"fragmentation": 1.0, "gpu_best_fit": 0.02},
    gpu_choice="fragmentation",
)

POLICY_NAMES = ("default", *PAPER_POLICIES)


def policy_for(name: str, trace_pods=None, seed: int = 0) -> Policy:
    """The named policy, with its workload measured from ``trace_pods`` (replay pods)."""
    from dataclasses import replace

    from .replay import typical_workload

    if name == "default":
        policy = DEFAULT_POLICY
    elif name in PAPER_POLICIES:
        policy = PAPER_POLICIES[name]
    else:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    policy = replace(policy, seed=seed)
    if trace_pods is not None:
        policy = policy.with_workload(typical_workload(trace_pods))
    return policy
