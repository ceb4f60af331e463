"""The plugin registry: every filter and scorer of the core, by name.

A plugin module (``plugins/``) registers its functions with ``register_filter`` or
``register_scorer``; a ``Policy`` then names which filters run (``policy.filters``, in order)
and which scorers rank (``policy.weights``). The registry is also the one list of names that
policy editing accepts (``placement.policy.policy_problems``).

Like Nomad's feasibility checkers and rank iterators, or the Filter and Score extension points of
the Kubernetes scheduler framework: filters say yes or no with one reason code, scorers rank
what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _always(*_args) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Filter:
    """``check(request, node, policy) -> reason | None``: the node is refused with the reason.

    ``applies(request)`` is False when the request asks nothing of this filter (the check would
    pass every node), so the chain skips it. ``static`` filters read only what placing work does
    not change (state, labels, architecture ...): a pass or a replay may check them once per node.
    """

    name: str
    check: Callable
    reasons: tuple[str, ...]
    static: bool
    applies: Callable = _always


@dataclass(frozen=True, slots=True)
class Scorer:
    """``score(request, node, fit, ctx) -> float``, higher is better, weighted by the policy.

    ``applies(request, ctx)`` is False when every node would get the same value (skipping it then
    changes all totals by one constant, so never a decision).
    """

    name: str
    score: Callable
    applies: Callable = _always


FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {}


def register_filter(name: str, *, reasons: tuple[str, ...], static: bool, applies=_always):
    """Decorator: register ``check`` as the filter ``name``."""

    def register(check):
        _add(FILTERS, name, Filter(name, check, tuple(reasons), static, applies))
        return check

    return register


def register_scorer(name: str, *, applies=_always):
    """Decorator: register ``score`` as the scorer ``name``."""

    def register(score):
        _add(SCORERS, name, Scorer(name, score, applies))
        return score

    return register


def _add(table: dict, name: str, entry) -> None:
    if name in table:
        raise ValueError(f"{name!r} is registered twice")
    table[name] = entry


def active_filters(req, ctx) -> tuple[tuple, tuple, tuple]:
    """(static checks, other checks, both) of the policy's filters that apply to ``req``, each
    in the policy's order; cached on the context for the last request."""
    if ctx.filters[0] is not req:
        chosen = [FILTERS[name] for name in ctx.policy.filters]
        chosen = [f for f in chosen if f.applies(req)]
        static = tuple(f.check for f in chosen if f.static)
        dynamic = tuple(f.check for f in chosen if not f.static)
        ctx.filters = (req, static, dynamic, static + dynamic)
    return ctx.filters[1:]


def active_scorers(req, ctx) -> tuple:
    """(name, weight, function) of the policy's scorers that matter for ``req``; cached."""
    if ctx.active[0] is not req:
        chosen = tuple(
            (name, weight, SCORERS[name].score)
            for name, weight in ctx.policy.weights.items()
            if SCORERS[name].applies(req, ctx)
        )
        ctx.active = (req, chosen)
    return ctx.active[1]
