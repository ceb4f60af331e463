"""The plugin registry: every filter and scorer, its name, reasons and when it applies."""

from dataclasses import fields, replace

import pytest
from hypothesis import HealthCheck, given, settings

from placement import (
    DEFAULT_POLICY,
    FILTERS,
    SCORERS,
    apply_placement,
    evaluate,
    make_context,
    place,
)
from placement import reasons as r
from placement.batch import plan
from placement.registry import (
    GPU_CHOICES,
    PLACEMENT_CHANGES,
    register_filter,
    register_scorer,
)
from placement.types import DEFAULT_FILTERS, Explanation, LeaseEnd, NodeView, Policy, Request

from .factories import POLICY, cpu_node, gpu_node
from .test_batch import clusters, one_by_one, requests

# Nodes as different as the filters can tell apart.
ODD_NODES = [
    cpu_node(state="draining", healthy=False, reachable=False, arch="arm64", os="windows"),
    gpu_node(
        labels={"team": "x"},
        workload_labels=frozenset({"app=db"}),
        region="mars",
        zone="mars-1",
        runtimes=frozenset(),
        network_class="none",
        free_cpu_millicores=0,
    ),
]


def test_the_default_chain_is_every_registered_filter_once():
    assert sorted(DEFAULT_FILTERS) == sorted(FILTERS)
    assert len(set(DEFAULT_FILTERS)) == len(DEFAULT_FILTERS)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_a_filter_says_which_reasons_it_emits(name):
    assert FILTERS[name].reasons
    assert set(FILTERS[name].reasons) <= r.ALL_REASONS


@pytest.mark.parametrize("name", sorted(n for n, f in FILTERS.items() if not f.applies(Request())))
def test_a_filter_that_does_not_apply_passes_every_node(name):
    # Request() asks for nothing in particular: skipping a filter then must change nothing.
    assert all(FILTERS[name].check(Request(), node, POLICY) is None for node in ODD_NODES)


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        register_filter("capacity", reasons=(r.INSUFFICIENT_CPU,), reads=(), static=False)(
            lambda *a: None
        )
    with pytest.raises(ValueError, match="registered twice"):
        register_scorer("bin_pack", reads=())(lambda *a: 0.0)


def test_evaluate_runs_the_policys_filters_in_order():
    node = cpu_node(state="draining", arch="arm64")
    req = Request(arch="amd64")
    ctx = make_context([node], POLICY)
    assert evaluate(req, node, ctx) == "node_not_schedulable(draining)"
    reordered = replace(POLICY, filters=("arch", "node_schedulable", "capacity"))
    assert evaluate(req, node, make_context([node], reordered)) == r.ARCH_MISMATCH
    without = replace(POLICY, filters=("capacity",))
    assert not isinstance(evaluate(req, node, make_context([node], without)), str)


def test_static_filters_may_be_skipped_once_checked():
    node = cpu_node(state="draining", free_cpu_millicores=0)
    ctx = make_context([node], POLICY)
    req = Request(cpu_millicores=1000)
    assert evaluate(req, node, ctx) == "node_not_schedulable(draining)"
    assert evaluate(req, node, ctx, static_checked=True) == r.INSUFFICIENT_CPU


def test_a_new_plugin_is_a_registration_and_a_policy_entry():
    @register_filter(
        "test_even_names", reasons=(r.AFFINITY_MISMATCH,), reads=("name",), static=True
    )
    def even_names(req, node, policy):
        return r.AFFINITY_MISMATCH if node.name.endswith(("1", "3")) else None

    @register_scorer("test_last_name", reads=("name",))
    def last_name(req, node, fit, ctx):
        return float(node.name[-1])

    try:
        nodes = [cpu_node(f"n{i}") for i in range(4)]
        policy = Policy(
            weights={"test_last_name": 1.0}, filters=(*DEFAULT_FILTERS, "test_even_names")
        )
        assert place(Request(cpu_millicores=1), nodes, policy).node == "n2"
        refused = place(Request(cpu_millicores=1), nodes[1:2], policy)
        assert refused.reasons == {r.AFFINITY_MISMATCH: 1}
    finally:
        del FILTERS["test_even_names"], SCORERS["test_last_name"]


# --- what plugins declare -------------------------------------------------------------------------


def test_a_plugin_that_reads_a_node_field_it_does_not_declare_fails_at_registration():
    with pytest.raises(ValueError, match=r"does not declare: \['leases'\]"):

        @register_filter("test_undeclared", reasons=(r.AFFINITY_MISMATCH,), reads=(), static=False)
        def undeclared(req, node, policy):
            return r.AFFINITY_MISMATCH if node.leases else None

    with pytest.raises(ValueError, match=r"does not declare: \['zone'\]"):  # through a helper
        register_scorer("test_helper", reads=("name",))(_scores_by_zone)
    with pytest.raises(ValueError, match=r"does not declare: \['rack'\]"):  # a lambda's bytecode
        register_scorer("test_lambda", reads=())(lambda req, node, fit, ctx: len(node.rack))
    with pytest.raises(ValueError, match="unknown node fields"):
        register_scorer("test_unknown", reads=("colour",))(lambda req, node, fit, ctx: 0.0)
    assert not {"test_undeclared", "test_helper", "test_lambda", "test_unknown"} & (
        set(FILTERS) | set(SCORERS)
    )


def _zone_length(node) -> float:
    return float(len(node.zone))


def _scores_by_zone(req, node, fit, ctx) -> float:
    return _zone_length(node) + len(node.name)


def test_a_static_filter_may_not_read_what_placing_work_changes():
    with pytest.raises(ValueError, match="static but reads what placing work changes"):
        register_filter(
            "test_static_cpu",
            reasons=(r.INSUFFICIENT_CPU,),
            reads=("free_cpu_millicores",),
            static=True,
        )(lambda req, node, policy: None if node.free_cpu_millicores else r.INSUFFICIENT_CPU)


def test_a_filter_never_lifts_only_reasons_it_emits():
    with pytest.raises(ValueError, match="not among its reasons"):
        register_filter(
            "test_lifted",
            reasons=(r.AFFINITY_MISMATCH,),
            reads=(),
            static=False,
            never_lifted=(r.INSUFFICIENT_CPU,),
        )(lambda req, node, policy: None)


class Recording:
    """A node that records which fields are read of it (through helpers and methods too)."""

    def __init__(self, node):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._node, name)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests())
def test_every_plugin_reads_at_most_what_it_declares(nodes, req):
    """What the batch planner's node kinds rest on, checked on real nodes: the registration's
    check follows module functions; this follows methods too (``ctx.workload.of_node``)."""
    policy = Policy(weights={name: 1.0 for name in SCORERS if name != "random"})
    ctx = make_context(nodes, policy, peers=nodes[:1])
    for node in nodes:
        for name, plugin in FILTERS.items():
            seen = Recording(node)
            plugin.check(req, seen, policy)
            assert seen.read <= plugin.reads, name
        result = evaluate(req, node, replace(ctx, filters=(None, (), (), ())))
        if isinstance(result, str):
            continue
        for name, plugin in SCORERS.items():
            seen = Recording(node)
            plugin.score(req, seen, result.fit, ctx)
            assert seen.read <= plugin.reads, name


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests(), requests())
def test_placing_work_changes_only_the_fields_static_filters_may_not_read(nodes, req, other):
    for node in nodes:
        placed = place(other, [node], DEFAULT_POLICY)
        if isinstance(placed, Explanation):
            continue
        after = apply_placement(node, placed)
        changed = {
            f.name for f in fields(NodeView) if getattr(after, f.name) != getattr(node, f.name)
        }
        assert changed <= PLACEMENT_CHANGES
        assert after.gpu_models == node.gpu_models


def test_a_new_filter_on_a_field_no_plugin_read_before_is_planned_as_place_decides():
    """The batch planner's kinds come from the registry: a filter on lease ends makes two
    nodes that differ only in their leases two kinds."""

    @register_filter(
        "test_no_leases", reasons=(r.AFFINITY_MISMATCH,), reads=("leases",), static=True
    )
    def no_leases(req, node, policy):
        return r.AFFINITY_MISMATCH if node.leases else None

    try:
        leased = replace(cpu_node("a-leased"), leases=(LeaseEnd("lease-1", 1000),))
        nodes = [leased, cpu_node("b-free")]
        policy = Policy(weights={"bin_pack": 1.0}, filters=(*DEFAULT_FILTERS, "test_no_leases"))
        reqs = [Request(cpu_millicores=1000), Request(cpu_millicores=1000)]
        outcomes, _ = plan(reqs, nodes, policy)
        assert [o.placement.node for o in outcomes] == ["b-free", "b-free"]
        assert [o.placement for o in outcomes] == one_by_one(reqs, nodes, policy)
    finally:
        del FILTERS["test_no_leases"]


def test_every_gpu_choice_a_policy_names_is_registered():
    assert set(GPU_CHOICES) == {"fragmentation", "best_fit", "lowest_index", "random"}
    assert GPU_CHOICES["random"].draws_random and not GPU_CHOICES["best_fit"].draws_random
