"""Required node labels, workload labels to avoid, preferred node labels."""

from placement import reasons as r
from placement.plugins.affinity import preferred_affinity
from placement.types import Request

from ..factories import cpu_node, ctx_for, fit_on, refusal


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
