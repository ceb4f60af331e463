"""Capacity bookkeeping: applying a placement to its node and releasing it."""

from placement.bookkeeping import apply_placement, apply_to_nodes, release
from placement.planner import place
from placement.types import Request

from .factories import POLICY, cpu_node, gpu_node


def test_apply_and_release_round_trip():
    node = gpu_node(gpus=2, sharing="mps")
    placed = place(
        Request(cpu_millicores=3000, memory_mib=100, gpu_count=1, gpu_milli=250, sharing="mps"),
        [node],
        POLICY,
    )
    used = apply_placement(node, placed)
    assert used.free_cpu_millicores == node.free_cpu_millicores - 3000
    assert used.free_gpu_milli == 1750
    back = release(used, placed)
    assert back.free_cpu_millicores == node.free_cpu_millicores
    assert back.free_gpu_milli == 2000
    assert [g.tenants for g in back.gpus] == [(), ()]


def test_apply_to_nodes_updates_only_the_placed_node():
    nodes = [cpu_node("a"), cpu_node("b")]
    placed = place(Request(cpu_millicores=1000), nodes, POLICY)
    updated = apply_to_nodes(nodes, placed)
    assert updated[0].free_cpu_millicores == 31000
    assert updated[1] is nodes[1]
