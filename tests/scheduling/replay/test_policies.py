"""The policies a replay runs by name."""

from dataclasses import replace

import pytest

from placement import DEFAULT_POLICY, policy_problems
from placement.fragmentation import Shape
from scheduling.replay import PAPER_POLICIES, Pod, policy_for


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        policy_for("tetris")


def test_the_default_is_the_cores_and_the_paper_policies_use_registered_scorers():
    assert policy_for("default", seed=3) == replace(DEFAULT_POLICY, seed=3)
    for policy in PAPER_POLICIES.values():
        assert policy_problems(dict(policy.weights)) == {}


def test_a_trace_attaches_the_measured_workload():
    pods = [Pod("a", 1000, 512, 1, 500), Pod("c", 1000, 1536, 1, 500), Pod("b", 2000, 0, 0, 0)]
    # The default: FGD's typical shapes, each with the mean memory of its pods.
    with_memory = {Shape(1000, 500, 1, frozenset(), 1024), Shape(2000, 0, 0, frozenset(), 0)}
    assert set(policy_for("default", pods).workload.shapes) == with_memory
    assert {s.memory_mib for s in policy_for("fgd", pods).workload.shapes} == {0}
