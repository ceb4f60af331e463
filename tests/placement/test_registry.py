"""The plugin registry: every filter and scorer, its name, reasons and when it applies."""

from dataclasses import replace

import pytest

from placement import FILTERS, SCORERS, evaluate, make_context, place
from placement import reasons as r
from placement.registry import register_filter, register_scorer
from placement.types import DEFAULT_FILTERS, Policy, Request

from .factories import POLICY, cpu_node, gpu_node

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
        register_filter("capacity", reasons=(r.INSUFFICIENT_CPU,), static=False)(lambda *a: None)
    with pytest.raises(ValueError, match="registered twice"):
        register_scorer("bin_pack")(lambda *a: 0.0)


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
    @register_filter("test_even_names", reasons=(r.AFFINITY_MISMATCH,), static=True)
    def even_names(req, node, policy):
        return r.AFFINITY_MISMATCH if node.name.endswith(("1", "3")) else None

    @register_scorer("test_last_name")
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
