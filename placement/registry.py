"""The plugin registry: every filter, scorer and GPU choice of the core, by name.

A plugin module (``plugins/``) registers its functions with ``register_filter``,
``register_scorer`` or ``register_gpu_choice``; a ``Policy`` then names which filters run
(``policy.filters``, in order), which scorers rank (``policy.weights``) and how shares choose a
device (``policy.gpu_choice``). The registry is also the one list of names that policy editing
accepts (``placement.policy.policy_problems``).

Like Nomad's feasibility checkers and rank iterators, or the Filter and Score extension points of
the Kubernetes scheduler framework: filters say yes or no with one reason code, scorers rank
what is left. Each plugin states what it depends on, so that no other module has to know:

- ``reads``: the node fields it reads. Checked at registration (``check_reads``: a plugin that
  reads ``node.x`` without declaring ``x`` fails at import); the batch planner's node kinds are
  made of exactly the fields some plugin or the core reads (``placement.batch``).
- ``never_lifted`` (filters): the reasons that placing more work on the node can never lift, as
  Kubernetes plugins return ``UnschedulableAndUnresolvable``; the batch planner never
  re-evaluates a node refused for one of them.
- ``static`` (filters): reads nothing that placing work changes (``PLACEMENT_CHANGES``), so a
  pass checks it once per node; checked at registration too.
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from itertools import pairwise

from .types import NodeView

# What a plugin may declare it reads: the node's fields and its derived properties.
NODE_FIELDS = frozenset(f.name for f in fields(NodeView)) | frozenset(
    name for name, value in vars(NodeView).items() if isinstance(value, property)
)
# The node fields ``bookkeeping.apply_placement`` changes (a test holds this list to it).
PLACEMENT_CHANGES = frozenset(
    {
        "free_cpu_millicores",
        "free_memory_mib",
        "free_scratch_mib",
        "gpus",  # free room, tenants, MIG slices; not what the devices are (gpu_models)
        "numa",
        "tenants",
        "workload_labels",
    }
)


def _always(*_args) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Filter:
    """``check(request, node, policy) -> reason | None``: the node is refused with the reason.

    ``applies(request)`` is False when the request asks nothing of this filter (the check would
    pass every node), so the chain skips it.
    """

    name: str
    check: Callable
    reasons: tuple[str, ...]
    static: bool
    reads: frozenset[str]
    never_lifted: frozenset[str]
    applies: Callable = _always


@dataclass(frozen=True, slots=True)
class Scorer:
    """``score(request, node, fit, ctx) -> float``, higher is better, weighted by the policy.

    ``applies(request, ctx)`` is False when every node would get the same value (skipping it then
    changes all totals by one constant, so never a decision). ``draws_random``: the planner then
    picks uniformly among the feasible nodes (``random``).
    """

    name: str
    score: Callable
    reads: frozenset[str]
    applies: Callable = _always
    draws_random: bool = False


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """``choose(devices, request, ctx) -> devices``: the devices a fractional share is scored
    on, in the order ties go (the first wins); ``draws_random`` like a scorer's."""

    name: str
    choose: Callable
    draws_random: bool = False


FILTERS: dict[str, Filter] = {}
SCORERS: dict[str, Scorer] = {}
GPU_CHOICES: dict[str, GpuChoice] = {}


def register_filter(
    name: str,
    *,
    reasons: tuple[str, ...],
    reads: Iterable[str],
    static: bool,
    never_lifted: Iterable[str] = (),
    applies=_always,
):
    """Decorator: register ``check`` as the filter ``name``."""

    def register(check):
        read, lifted = check_reads(name, check, reads), frozenset(never_lifted)
        if not lifted <= set(reasons):
            raise ValueError(
                f"filter {name!r}: never_lifted {sorted(lifted - set(reasons))} "
                "are not among its reasons"
            )
        if static and read & PLACEMENT_CHANGES:
            raise ValueError(
                f"filter {name!r} is static but reads what placing work changes: "
                f"{sorted(read & PLACEMENT_CHANGES)}"
            )
        _add(FILTERS, name, Filter(name, check, tuple(reasons), static, read, lifted, applies))
        return check

    return register


def register_scorer(name: str, *, reads: Iterable[str], applies=_always, draws_random=False):
    """Decorator: register ``score`` as the scorer ``name``."""

    def register(score):
        _add(
            SCORERS,
            name,
            Scorer(name, score, check_reads(name, score, reads), applies, draws_random),
        )
        return score

    return register


def register_gpu_choice(name: str, *, draws_random=False):
    """Decorator: register ``choose`` as the GPU choice ``name`` (``Policy.gpu_choice``)."""

    def register(choose):
        _add(GPU_CHOICES, name, GpuChoice(name, choose, draws_random))
        return choose

    return register


def _add(table: dict, name: str, entry) -> None:
    if name in table:
        raise ValueError(f"{name!r} is registered twice")
    table[name] = entry


def check_reads(name: str, function: Callable, reads: Iterable[str], node_arg: int = 1):
    """``reads`` as a frozenset, once it is known to cover every ``node.<field>`` that
    ``function`` reads of its node argument, directly or through the module functions it hands
    the node to. ValueError naming what is undeclared (or unknown). A node handed to a method
    (``ctx.workload.of_node(node)``) is not followed: the declaration covers it, and
    tests/placement/test_registry.py records every plugin's reads on real nodes."""
    declared = frozenset(reads)
    if unknown := declared - NODE_FIELDS:
        raise ValueError(f"{name!r} declares reads of unknown node fields {sorted(unknown)}")
    if undeclared := _node_reads(function, node_arg, set()) - declared:
        raise ValueError(f"{name!r} reads node fields it does not declare: {sorted(undeclared)}")
    return declared


def _node_reads(function: Callable, node_arg: int, seen: set) -> set[str]:
    key = (function, node_arg)
    if key in seen or not inspect.isfunction(function):
        return set()
    seen.add(key)
    code = function.__code__
    if node_arg >= code.co_argcount:
        return set()
    node = code.co_varnames[node_arg]
    if function.__name__ == "<lambda>":  # its source is a line, maybe not a whole statement
        return _lambda_reads(code, node)
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    found: set[str] = set()
    for item in ast.walk(definition):
        if isinstance(item, ast.Attribute) and _is(item.value, node):
            found.add(item.attr)
        elif isinstance(item, ast.Call) and isinstance(item.func, ast.Name):
            callee = function.__globals__.get(item.func.id)
            for position, arg in enumerate(item.args):
                if _is(arg, node):
                    found |= _node_reads(callee, position, seen)
    return found


def _lambda_reads(code, node: str) -> set[str]:
    """The attributes read of the local ``node`` in a lambda's bytecode."""
    return {
        after.argval
        for before, after in pairwise(dis.get_instructions(code))
        if before.opname == "LOAD_FAST"
        and before.argval == node
        and after.opname in ("LOAD_ATTR", "LOAD_METHOD")
    }


def _is(expression, name: str) -> bool:
    return isinstance(expression, ast.Name) and expression.id == name


def never_lifted() -> frozenset[str]:
    """Every filter's reasons that placing work never lifts."""
    return frozenset().union(*(f.never_lifted for f in FILTERS.values()))


def all_reads() -> frozenset[str]:
    """Every node field some filter or scorer reads."""
    return frozenset().union(*(p.reads for p in (*FILTERS.values(), *SCORERS.values())))


def reads_for(req, ctx) -> frozenset[str]:
    """The node fields the policy's filters and scorers that apply to ``req`` read."""
    chosen = [FILTERS[name] for name in ctx.policy.filters if FILTERS[name].applies(req)]
    chosen += [SCORERS[name] for name in ctx.policy.weights if SCORERS[name].applies(req, ctx)]
    return frozenset().union(*(p.reads for p in chosen))


def random_scorer(policy) -> bool:
    """Whether the policy weighs a random scorer: the planner picks among feasible nodes."""
    return any(SCORERS[n].draws_random for n in policy.weights if n in SCORERS)


def draws_random(policy) -> bool:
    """Whether placing under ``policy`` draws random numbers (a random scorer or GPU choice)."""
    choice = GPU_CHOICES.get(policy.gpu_choice)
    return random_scorer(policy) or bool(choice and choice.draws_random)


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
