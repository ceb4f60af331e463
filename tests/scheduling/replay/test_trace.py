"""Reading the OpenB trace, and the protocol's arrival and node orders."""

from dataclasses import replace
from pathlib import Path

from scheduling.replay import Pod, build_arrivals, node_order, read_nodes, read_pods

FIXTURES = Path(__file__).parent / "fixtures"
TINY_NODES = str(FIXTURES / "openb_tiny_nodes.csv")
TINY_PODS = str(FIXTURES / "openb_tiny_pods.csv")


def test_read_fixture():
    nodes = read_nodes(TINY_NODES)
    assert [n.name for n in nodes] == [f"openb-node-000{i}" for i in range(4)]
    assert [len(n.gpus) for n in nodes] == [2, 2, 4, 1]
    pods = read_pods(TINY_PODS)
    assert len(pods) == 12
    assert pods[7].gpu_spec == "T4" and pods[7].gpu_milli == 700


def test_arrivals_are_a_seeded_shuffle_then_inflated_to_the_target():
    pods = [Pod(f"p{i}", 1000, 0, 1, 500) for i in range(10)]  # demand 5000
    arrivals = build_arrivals(pods, seed=1, tune=1.3, capacity_milli=5000)
    assert sorted(p.name for p in arrivals[:10]) == sorted(p.name for p in pods)
    assert sum(p.demand for p in arrivals) == 6500  # 3 clones fit under 6500, the 4th would not
    assert build_arrivals(pods, 1, 1.3, 5000) == arrivals
    assert build_arrivals(pods, 2, 1.3, 5000)[:10] != arrivals[:10]


def test_arrivals_trimmed_when_demand_exceeds_the_target():
    pods = [Pod(f"p{i}", 1000, 0, 2, 1000) for i in range(10)]  # demand 20000
    arrivals = build_arrivals(pods, seed=3, tune=1.3, capacity_milli=10000)
    assert sum(p.demand for p in arrivals) <= 13000
    assert len(arrivals) == 6
    shuffled = [p.name for p in build_arrivals(pods, 3, 10.0, 10000)[:10]]
    kept = {p.name for p in arrivals}
    assert [p.name for p in arrivals] == [n for n in shuffled if n in kept]


def test_node_order_renames_with_a_seeded_permutation_prefix_like_the_simulator():
    nodes = read_nodes(TINY_NODES)
    ordered = node_order(nodes, 42)
    assert [n.name for n in ordered] == sorted(n.name for n in ordered)
    assert sorted(n.name[5:] for n in ordered) == sorted(n.name for n in nodes)
    assert sorted(int(n.name[:4]) for n in ordered) == list(range(len(nodes)))
    assert [n.name for n in node_order(nodes, 42)] == [n.name for n in ordered]
    many = [replace(nodes[0], name=f"openb-node-{i:04d}") for i in range(50)]
    assert [n.name for n in node_order(many, 1)] != [n.name for n in node_order(many, 2)]
    # Everything but the name is kept.
    by_old = {n.name[5:]: n for n in ordered}
    assert all(replace(by_old[n.name], name=n.name) == n for n in nodes)
