"""The data_locality scorer (placement/plugins/data_locality.py): the node where a request's data
(image, inputs) arrives soonest wins; a node that holds it all arrives at once. Pure: no Django."""

from placement import types as t
from placement.context import make_context
from placement.planner import place
from placement.plugins.data_locality import ARRIVAL_SCALE_S, data_locality, estimate
from placement.policy import DEFAULT_POLICY
from placement.registry import SCORERS

IMAGE = "sha256:" + "a" * 64
INPUT = "https://data.example/sets/train.tar"
GB = 10**9


def node(name, **fields):
    return t.NodeView(name=name, cpu_millicores=8000, memory_mib=16384, **fields)


def request(**fields):
    return t.Request(cpu_millicores=500, memory_mib=512, **fields)


def test_a_node_holding_the_image_and_inputs_wins_over_an_equal_one_that_does_not():
    cold = node("a-cold")  # first by name: it would win every tie
    warm = node("b-warm", cached_data=frozenset({(IMAGE, 2 * GB), (INPUT, 3 * GB)}))
    placement = place(request(image=IMAGE, inputs=(INPUT,)), [cold, warm], DEFAULT_POLICY)
    assert placement.node == "b-warm"
    assert placement.score_breakdown["data_locality"] == 1.0
    # the decision record's figures: nothing moves there
    assert placement.data_avoided_bytes == 5 * GB
    assert placement.data_moved_bytes == 0 and placement.data_arrival_s == 0.0


def test_inputs_alone_decide_too_and_the_cold_node_is_told_what_would_move():
    cold = node("a-cold", download_bytes_per_s=50e6)
    warm = node("b-warm", cached_data=frozenset({(INPUT, GB)}))
    ctx = make_context([cold, warm], DEFAULT_POLICY)
    assert estimate(request(inputs=(INPUT,)), cold, ctx.data_sizes) == (0, GB, 20.0)
    assert place(request(inputs=(INPUT,)), [cold, warm], DEFAULT_POLICY).node == "b-warm"


def test_a_huge_cache_on_a_slow_node_loses_to_a_small_transfer_on_a_fast_one():
    """The rule scores when the data is there, not how much is avoided: the slow node holds the
    9 GB image but must still download the 1 GB input at 10 MB/s (100 s); the fast node must
    pull all 10 GB, at 1 GB/s (10 s)."""
    slow = node(
        "a-slow-holds-most",
        cached_data=frozenset({(IMAGE, 9 * GB)}),
        download_bytes_per_s=10e6,
        pull_bytes_per_s=10e6,
    )
    fast = node(
        "b-fast-holds-nothing",
        cached_data=frozenset({(INPUT + "?other", 1)}),
        download_bytes_per_s=1e9,
        pull_bytes_per_s=1e9,
    )
    other = node("c-sizes", cached_data=frozenset({(INPUT, GB)}), download_bytes_per_s=1.0)
    req = request(image=IMAGE, inputs=(INPUT,))
    ctx = make_context([slow, fast, other], DEFAULT_POLICY)
    assert estimate(req, slow, ctx.data_sizes) == (9 * GB, GB, 100.0)
    assert estimate(req, fast, ctx.data_sizes) == (0, 10 * GB, 10.0)
    placement = place(req, [slow, fast], DEFAULT_POLICY, ctx)
    assert placement.node == "b-fast-holds-nothing"
    assert placement.data_avoided_bytes == 0 and placement.data_arrival_s == 10.0


def test_the_score_halves_at_the_scale_and_unmeasured_nodes_get_the_default_rate():
    holder = node("holder", cached_data=frozenset({(INPUT, 6 * GB)}))
    unmeasured = node("unmeasured")
    ctx = make_context([holder, unmeasured], DEFAULT_POLICY)
    req = request(inputs=(INPUT,))
    # 6 GB at the default 100 MB/s: exactly the scale (60 s)
    assert estimate(req, unmeasured, ctx.data_sizes)[2] == ARRIVAL_SCALE_S
    fit = None
    assert data_locality(req, unmeasured, fit, ctx) == 0.5
    assert data_locality(req, holder, fit, ctx) == 1.0


def test_it_skips_requests_whose_data_no_node_reports_and_declares_what_it_reads():
    scorer = SCORERS["data_locality"]
    assert scorer.reads == {"cached_data", "pull_bytes_per_s", "download_bytes_per_s"}
    plain = [node("a"), node("b")]
    ctx = make_context(plain, DEFAULT_POLICY)
    assert not scorer.applies(request(image=IMAGE), ctx)  # no node reports it: all alike
    ctx = make_context([*plain, node("c", cached_data=frozenset({(IMAGE, 1)}))], DEFAULT_POLICY)
    assert scorer.applies(request(image=IMAGE), ctx)
    assert not scorer.applies(request(), ctx)  # no data at all
    assert DEFAULT_POLICY.weights["data_locality"] > 0


def test_a_request_without_data_has_no_data_figures():
    placement = place(request(), [node("a")], DEFAULT_POLICY)
    assert placement.data_arrival_s is None and placement.data_avoided_bytes == 0


def test_node_views_take_the_cache_as_a_mapping_or_pairs():
    view = t.NodeView.from_dict({"name": "n", "cached_data": {IMAGE: 7}})
    assert view.cached_data == frozenset({(IMAGE, 7)})
    assert t.NodeView.from_dict({"name": "n", "cached_data": [[IMAGE, 7]]}) == view
