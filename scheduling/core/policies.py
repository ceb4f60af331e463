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

# The product default (see docs/scheduler.md): FGD's fragmentation gradient on its 0..100
# integer scale, measured against the whole request mix including memory (DEFAULT_WORKLOAD);
# ties broken towards nodes already running work, then towards the tightest node unless its
# GPU model is one that model-pinned requests depend on, then by node name. The weights make the
# order lexicographic. Preference scorers (locality, affinity, warm image, replica spread) come
# first when a request expresses them; they are 0 otherwise, as in the trace replay.
DEFAULT_POLICY = Policy(
    name="default",
    version=DEFAULT_POLICY_VERSION,
    weights={
        "affinity": 1e9,
        "locality": 1e9,
        "failure_domain_spread": 1e9,
        "warm_image": 1e8,
        "paper_fgd": 1e6,
        "node_in_use": 1e3,
        "best_fit_unpinned": 1.0,
    },
    gpu_choice="fragmentation",
    truncated=("paper_fgd", "node_in_use", "best_fit_unpinned"),
)

#: How each policy's typical workload is measured from a trace (``typical_workload`` options).
DEFAULT_WORKLOAD = {"with_memory": True, "coverage": 1.0}
PAPER_WORKLOAD = {"with_memory": False, "coverage": 0.95}

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
        options = DEFAULT_WORKLOAD if name == "default" else PAPER_WORKLOAD
        policy = policy.with_workload(typical_workload(trace_pods, **options))
    return policy
