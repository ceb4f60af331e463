"""Required node labels, workload labels to avoid, preferred node labels."""

from dataclasses import replace

from placement import place, place_gang
from placement import reasons as r
from placement.bookkeeping import with_zone_work
from placement.plugins.affinity import preferred_affinity
from placement.types import Request

from ..factories import POLICY, cpu_node, ctx_for, fit_on, refusal


def test_affinity_requires_every_label():
    req = Request(affinity={"team": "a"})
    assert refusal("affinity", req, cpu_node(labels={"team": "b"})) == r.AFFINITY_MISMATCH
    assert refusal("affinity", req, cpu_node(labels={"team": "a", "x": "y"})) is None


def test_anti_affinity_avoids_nodes_running_a_label():
    node = cpu_node(workload_labels=frozenset({"app=db"}))
    assert refusal("anti_affinity", Request(anti_affinity=("app=db",)), node) == r.ANTI_AFFINITY
    assert refusal("anti_affinity", Request(anti_affinity=("app=web",)), node) is None


def test_preferred_affinity_scores_the_share_of_matching_labels():
    node = cpu_node(labels={"disk": "nvme"})
    req = Request(preferred_affinity={"disk": "nvme", "gpu": "yes"})
    assert preferred_affinity(req, node, fit_on(node), ctx_for([node])) == 0.5


def test_zone_scoped_anti_affinity_avoids_the_zone_of_work_with_the_label():
    web = frozenset({"app=web"})
    busy = cpu_node("a1", zone="a", workload_labels=web)
    idle_a, idle_b = cpu_node("a2", zone="a"), cpu_node("b1", zone="b")
    zoneless = cpu_node("x1", zone_workload_labels=web)  # no zone: its own work alone counts
    host = Request(anti_affinity=("app=web",))
    zone = replace(host, anti_affinity_scope="zone")
    nodes = with_zone_work([busy, idle_a, idle_b, zoneless])
    refused = {n.name for n in nodes if refusal("anti_affinity", zone, n)}
    assert refused == {"a1", "a2"}
    assert {n.name for n in nodes if refusal("anti_affinity", host, n)} == {"a1"}
    # the adapter's reading of nodes outside the snapshot (a draining one) counts as well
    assert refusal("anti_affinity", zone, cpu_node("b2", zone="b", zone_workload_labels=web))
    assert place(zone, [busy, idle_a, idle_b], POLICY).node == "b1"
    assert place(zone, [busy, idle_a], POLICY).reasons == {r.ANTI_AFFINITY: 2}


def test_a_zone_scoped_gang_counts_its_own_replicas_in_their_zones():
    nodes = [cpu_node(f"{zone}{i}", zone=zone) for zone in "ab" for i in (1, 2)]
    req = Request(
        cpu_millicores=1000,
        labels=("app=web",),
        anti_affinity=("app=web",),
        anti_affinity_scope="zone",
        replicas=2,
        gang="spread_hosts",
    )
    placed = place_gang(req, nodes, POLICY)
    assert sorted(p.node[0] for p in placed.placements) == ["a", "b"]
    assert not place_gang(replace(req, replicas=3), nodes, POLICY)
