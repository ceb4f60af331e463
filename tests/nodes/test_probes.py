"""Validation probes of a marketplace node's claims (nodes/services/probes.py)."""

import pytest

from nodes import services
from nodes.choices import NodeState, ProbeState
from nodes.errors import NodeScopeRefused
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .conftest import last_event, measured, reasons

S = NodeState


def test_marketplace_node_needs_a_probe_and_passes(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    assert enrolled.probe.state == ProbeState.REQUESTED
    assert reasons(node) == [Reason.ENROLLED, Reason.PROBE_REQUESTED]
    # an authenticated heartbeat alone is not enough in a marketplace
    node = services.node_heartbeat(node=node, actor=Actor.for_node(node))
    assert node.state == S.REGISTERED
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(node)
    )
    assert probe.state == ProbeState.PASSED and probe.differences == []
    node.refresh_from_db()
    assert node.state == S.READY
    assert reasons(node)[-2:] == [Reason.PROBE_PASSED, Reason.PROBE_PASSED]


def test_probe_mismatch_quarantines_with_the_difference(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    result = measured(node)
    result["gpus"][1]["model"] = "NVIDIA GeForce RTX 4090"
    result["cpu_count"] = 16
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert probe.state == ProbeState.FAILED
    node.refresh_from_db()
    assert node.state == S.QUARANTINED
    event = last_event(node)
    assert event.reason == Reason.PROBE_MISMATCH
    assert "RTX 4090" in event.message and "cpu: claimed 64000m, measured 16000m" in event.message
    assert event.data["differences"] == probe.differences


def test_probe_missing_benchmark_or_gpu_is_a_mismatch(enroll, market_pool):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node, benchmark={})
    result["gpus"].pop()
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert any("not seen" in d for d in probe.differences)
    assert "benchmark: no result" in probe.differences


def test_probe_result_only_from_that_nodes_credential_and_only_once(enroll, market_pool):
    first, second = enroll(market_pool), enroll(market_pool)
    with pytest.raises(NodeScopeRefused):
        services.probe_result_submit(
            probe=first.probe, credential=second.credential, result=measured(first.node)
        )
    first.probe.refresh_from_db()
    assert first.probe.state == ProbeState.REQUESTED
    services.probe_result_submit(
        probe=first.probe, credential=first.credential, result=measured(first.node)
    )
    with pytest.raises(TransitionRefused) as refused:
        services.probe_result_submit(
            probe=first.probe, credential=first.credential, result=measured(first.node)
        )
    assert refused.value.code == "probe_closed"
