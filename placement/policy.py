"""The product's default policy, defined once, and the one way to build a policy from edited
values (``policy_from``), which refuses what the registry does not know.

A new pool's first policy version is ``DEFAULT_POLICY``'s weights (``pools.services``); policy
editing checks weights and filters with ``policy_problems`` (``pools.validation``); the snapshot
builds each pool's policy with ``policy_from``, so no name is ever dropped on the way.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .registry import FILTERS, SCORERS
from .types import DEFAULT_FILTERS, Policy

# Large enough for the default's lexicographic weights (1e9), small enough that a weighted sum
# of 0..100 scores stays exact in a float.
MAX_WEIGHT = 1e12

# The product default (see docs/scheduler.md): FGD's fragmentation gradient on its 0..100
# integer scale, with the fragmentation coupled to the memory a node has left (``memory_fgd``:
# GPUs without the memory to run typical requests on them are fragments) and measured against
# FGD's typical requests, each with the mean memory of its requests; ties broken towards nodes
# already running work, then towards the tightest node unless its GPU model is one that
# model-pinned requests depend on, then by node name. The weights make the order
# lexicographic. Preference scorers (locality, affinity, warm image, data locality — when the
# data arrives, 0..1, so it trades against fragmentation —, replica spread) come first
# when a request expresses them; they are 0 otherwise, as in the trace replay.
DEFAULT_POLICY = Policy(
    name="default",
    version=1,
    weights={
        "affinity": 1e9,
        "locality": 1e9,
        "failure_domain_spread": 1e9,
        "warm_image": 1e8,
        "data_locality": 1e8,
        "memory_fgd": 1e6,
        "node_in_use": 1e3,
        "best_fit_unpinned": 1.0,
    },
    filters=DEFAULT_FILTERS,
    gpu_choice="fragmentation",
    # paper_fgd (the previous default's term) stays truncated: a pool whose stored version
    # still names it is built from these fields too, and places exactly as it did.
    truncated=("memory_fgd", "paper_fgd", "node_in_use", "best_fit_unpinned"),
)


def policy_problems(weights, filters=None) -> dict[str, list[str]]:
    """What is wrong with edited weights (scorer name -> number) and filters (names), by field;
    empty when they make a policy."""
    problems = {}
    if not isinstance(weights, dict) or not weights:
        problems["weights"] = ["A non-empty map of scorer name to a non-negative number."]
    else:
        found = [_weight_problem(name, value) for name, value in weights.items()]
        if found := [p for p in found if p]:
            problems["weights"] = found
    if filters is not None:
        if not isinstance(filters, list | tuple) or not all(isinstance(f, str) for f in filters):
            problems["filters"] = ["A list of filter names."]
        elif found := [_unknown(name, FILTERS) for name in filters if name not in FILTERS]:
            problems["filters"] = found
        elif len(set(filters)) < len(filters):
            problems["filters"] = ["Each filter is named once."]
    return problems


def policy_from(weights, filters=None, **fields) -> Policy:
    """The default policy with these weights (and filters, and other ``Policy`` fields such as
    ``version``); ValueError naming every unknown name or bad value."""
    if problems := policy_problems(weights, filters):
        raise ValueError("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()))
    if filters is not None:
        fields["filters"] = tuple(filters)
    return replace(DEFAULT_POLICY, weights={k: float(v) for k, v in weights.items()}, **fields)


def _weight_problem(name, value) -> str | None:
    if name not in SCORERS:
        return _unknown(name, SCORERS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name!r} must be a number."
    if not math.isfinite(value) or not 0 <= value <= MAX_WEIGHT:
        return f"{name!r} must be between 0 and {MAX_WEIGHT:g}."
    return None


def _unknown(name, known: dict) -> str:
    return f"{name!r} is unknown (known: {', '.join(sorted(known))})."
