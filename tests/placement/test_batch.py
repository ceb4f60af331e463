"""The batch planner makes the decisions `place` makes one request at a time, on random
clusters, and keeps a bounded decision record for each placement."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import DEFAULT_POLICY, apply_placement, evaluate, make_context, place
from placement.batch import TOP_CANDIDATES, plan, stays_rejected
from placement.types import Explanation, GpuView, NumaView, Policy, Request

from .factories import cpu_node, gpu_node

POLICIES = [
    DEFAULT_POLICY,
    Policy(weights={"fragmentation": 1.0, "bin_pack": 0.1}),
    Policy(weights={"spread": 1.0}, gpu_choice="lowest_index", allow_tenant_mixing=True),
    Policy(weights={"paper_best_fit": 1.0}, gpu_choice="best_fit", integer_scores=True),
]
MODELS = [("A100-80GB", 81920), ("T4", 16384), ("H100-80GB", 81920)]


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 7))):
        name = f"n{draw(st.integers(0, 99)):02d}-{i}"
        zone = draw(st.sampled_from(["a", "b"]))
        if draw(st.booleans()):
            nodes.append(cpu_node(name, cpu=draw(st.sampled_from([4000, 8000, 16000])), zone=zone))
            continue
        model, memory = draw(st.sampled_from(MODELS))
        sharing = draw(st.sampled_from(["exclusive", "timeslice", "mig"]))
        gpus = tuple(
            GpuView(
                j,
                model=model,
                memory_mib=memory,
                sharing=sharing,
                uuid=f"{name}-{j}",
                interconnect_group=draw(st.sampled_from(["", "g0"])),
                numa_node=j % 2,
            )
            for j in range(draw(st.integers(1, 4)))
        )
        numa = (NumaView(0, 8000, 65536), NumaView(1, 8000, 65536))
        nodes.append(
            replace(
                gpu_node(name, cpu=16000, mem=131072, zone=zone),
                gpus=gpus,
                numa=numa if draw(st.booleans()) else (),
            )
        )
    # now and then a node being drained (it takes drain-exempt requests only) or quarantined
    for i, state in enumerate(
        draw(st.lists(st.sampled_from(["draining", "quarantined"]), max_size=2))
    ):
        if i < len(nodes):
            nodes[i] = replace(nodes[i], state=state)
    # twins: copies under other names (and device UUIDs), which the plan evaluates as one kind
    for k, i in enumerate(draw(st.lists(st.integers(0, len(nodes) - 1), max_size=4))):
        name = f"twin-{k}"
        gpus = tuple(replace(g, uuid=f"{name}-{g.index}") for g in nodes[i].gpus)
        nodes.append(replace(nodes[i], name=name, gpus=gpus))
    names = [n.name for n in nodes]
    return [n for i, n in enumerate(nodes) if n.name not in names[:i]]  # unique names


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["cpu", "whole", "share", "mig"]))
    fields = {
        "cpu_millicores": draw(st.sampled_from([500, 2000, 4000])),
        "memory_mib": draw(st.sampled_from([1024, 16384])),
        "tenant": draw(st.sampled_from(["t1", "t2"])),
        "labels": tuple(draw(st.lists(st.sampled_from(["app=a", "app=b"]), max_size=1))),
    }
    if draw(st.booleans()):
        fields["preferred_cpu_millicores"] = 6000
    if draw(st.integers(0, 4)) == 0:
        fields["require_numa"] = True
    if draw(st.integers(0, 4)) == 0:
        fields["anti_affinity"] = ("app=a",)
        # zone: one node's fit depends on its zone's other nodes (planned by `place` itself)
        fields["anti_affinity_scope"] = draw(st.sampled_from(["host", "zone"]))
    if draw(st.integers(0, 4)) == 0:
        fields["zones"] = ("a",)
    if draw(st.integers(0, 9)) == 0:  # a twin's kind is shared; its name is its own
        fields["node_pin"] = draw(st.sampled_from(["twin-0", "twin-1"]))
    if draw(st.integers(0, 5)) == 0:  # a volume's export: a draining node takes it too
        fields["drain_exempt"] = True
    if kind == "whole":
        fields.update(gpu_count=draw(st.integers(1, 2)), sharing="exclusive")
        if draw(st.booleans()):
            fields["require_interconnect"] = True
    elif kind == "share":
        fields.update(gpu_count=1, sharing="timeslice", gpu_milli=draw(st.sampled_from([250, 500])))
    elif kind == "mig":
        fields.update(
            gpu_count=1, sharing="mig", mig_profile=draw(st.sampled_from(["1g.10gb", "3g.40gb"]))
        )
    return Request(**fields)


def one_by_one(reqs, nodes, policy):
    """What the single path does: `place` then take, request after request."""
    nodes = list(nodes)
    ctx = make_context(nodes, policy)
    out = []
    for req in reqs:
        result = place(req, nodes, policy, ctx)
        if isinstance(result, Explanation):
            out.append(None)
            continue
        at = next(i for i, n in enumerate(nodes) if n.name == result.node)
        nodes[at] = apply_placement(nodes[at], result)
        out.append(result)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(requests(), min_size=1, max_size=25), st.sampled_from(POLICIES))
def test_the_plan_makes_the_decisions_place_makes_one_by_one(nodes, reqs, policy):
    outcomes, _ = plan(reqs, nodes, policy)
    expected = one_by_one(reqs, nodes, policy)
    for outcome, single in zip(outcomes, expected, strict=True):
        assert outcome.error is None
        if single is None:
            assert outcome.placement is None and outcome.explanation is not None
        else:
            assert outcome.placement == single


@settings(max_examples=200, deadline=None)
@given(clusters(), requests(), requests(), st.sampled_from(POLICIES))
def test_a_node_refused_for_good_stays_refused_when_work_is_placed_on_it(nodes, req, other, policy):
    """The claim behind ``never_lifted``: placing work on a node never lifts those refusals."""
    ctx = make_context(nodes, policy)
    for node in nodes:
        reason = evaluate(req, node, ctx)
        placed = place(other, [node], policy)
        if not isinstance(reason, str) or reason not in stays_rejected() or not placed:
            continue
        assert isinstance(evaluate(req, apply_placement(node, placed), ctx), str)


def test_the_decision_record_names_the_rejections_the_top_candidates_and_the_choice():
    nodes = [cpu_node(f"c{i}", cpu=4000) for i in range(5)] + [gpu_node("g1")]
    reqs = [Request(cpu_millicores=3000), Request(cpu_millicores=3000, gpu_count=1)]
    outcomes, after = plan(reqs, nodes, DEFAULT_POLICY)
    first = outcomes[0].decision
    assert first["policy_version"] == DEFAULT_POLICY.version and first["nodes"] == 6
    assert first["chosen"] == outcomes[0].placement.node
    assert len(first["candidates"]) == TOP_CANDIDATES
    assert first["candidates"][0]["node"] == first["chosen"]
    assert set(first["candidates"][0]["breakdown"]) <= set(DEFAULT_POLICY.weights)
    assert first["rejected"] == {}
    gpu = outcomes[1].decision
    assert gpu["rejected"] == {"insufficient_gpu": 5}  # the CPU nodes, by the gpu_model filter
    assert [c["node"] for c in gpu["candidates"]] == ["g1"]
    assert sum(n.free_cpu_millicores for n in after) == sum(n.cpu_millicores for n in nodes) - 6000


def test_a_class_that_fits_nowhere_is_explained_and_admit_may_refuse():
    nodes = [cpu_node("c1", cpu=4000)]
    reqs = [Request(cpu_millicores=3000, tenant="a"), Request(cpu_millicores=3000, tenant="b")]
    reqs.append(Request(cpu_millicores=1000, tenant="a"))
    refused = lambda position, placement: "over quota" if position == 2 else ""  # noqa: E731
    outcomes, after = plan(reqs, nodes, DEFAULT_POLICY, admit=refused)
    assert outcomes[0].placement.node == "c1"
    assert outcomes[1].explanation.reasons == {"insufficient_cpu": 1}
    assert outcomes[2].refusal == "over quota" and outcomes[2].placement is None
    assert after[0].free_cpu_millicores == 1000  # the refused placement took nothing


def test_an_error_planning_one_request_is_its_outcome_and_the_others_go_on():
    class Broken(Request):
        @property
        def wants_gpu(self):
            raise RuntimeError("corrupt")

    nodes = [cpu_node("c1")]
    outcomes, _ = plan([Broken(cpu_millicores=1), Request(cpu_millicores=1)], nodes, DEFAULT_POLICY)
    assert isinstance(outcomes[0].error, RuntimeError)
    assert outcomes[1].placement.node == "c1"


def test_nodes_of_one_kind_are_evaluated_once_per_class(monkeypatch):
    """A fresh fleet of equal nodes costs one evaluation per class, then one per kind that
    placing work makes; the decisions stay place()'s (ties to the smallest name)."""
    from placement import batch

    calls = []
    real = batch.evaluate
    monkeypatch.setattr(batch, "evaluate", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
    nodes = [cpu_node(f"c{i:03d}", cpu=4000) for i in range(100)]
    reqs = [Request(cpu_millicores=1000), Request(cpu_millicores=3000)] * 3
    outcomes, _ = plan(reqs, nodes, DEFAULT_POLICY)
    assert [o.placement.node for o in outcomes] == [
        p.node for p in one_by_one(reqs, nodes, DEFAULT_POLICY)
    ]
    assert len(calls) < 20  # not 2 classes x 100 nodes


def test_work_placed_in_a_zone_keeps_zone_scoped_requests_out_of_the_whole_zone():
    """A placement changes one node, and a zone-scoped request's fit on every node of that zone:
    the plan sees it as `place` does, however the classes cached the nodes before."""
    nodes = [cpu_node("a1", zone="a"), cpu_node("a2", zone="a"), cpu_node("b1", zone="b")]
    avoid = Request(cpu_millicores=1000, anti_affinity=("app=a",), anti_affinity_scope="zone")
    web = Request(cpu_millicores=1000, labels=("app=a",), node_pin="a1")
    reqs = [avoid, web, avoid, replace(avoid, anti_affinity_scope="host")]
    outcomes, _ = plan(reqs, nodes, DEFAULT_POLICY)
    assert [o.placement.node for o in outcomes[:3]] == [
        p.node for p in one_by_one(reqs, nodes, DEFAULT_POLICY)[:3]
    ]
    assert outcomes[1].placement.node == "a1" and outcomes[2].placement.node == "b1"
    assert outcomes[3].placement.node != "a1"  # host scope: the zone's other node will do
