"""The default policy, defined once, and building a policy from edited values."""

import math
from itertools import pairwise

import pytest

from placement import DEFAULT_POLICY, FILTERS, SCORERS, policy_from, policy_problems


def test_the_default_names_only_registered_plugins():
    assert set(DEFAULT_POLICY.weights) <= set(SCORERS)
    assert set(DEFAULT_POLICY.filters) == set(FILTERS)
    # paper_fgd: the previous default's term, for pools whose stored version still names it.
    assert set(DEFAULT_POLICY.truncated) <= set(DEFAULT_POLICY.weights) | {"paper_fgd"}
    assert policy_problems(dict(DEFAULT_POLICY.weights), list(DEFAULT_POLICY.filters)) == {}


def test_the_default_ranks_by_memory_coupled_fgd_then_its_tie_breakers():
    # Issue 12: the fragmentation term is coupled to memory (memory_fgd), no longer paper_fgd;
    # the tie-breakers below it are unchanged. Lexicographic: each weight dwarfs the next.
    weights = DEFAULT_POLICY.weights
    assert "paper_fgd" not in weights
    order = ["memory_fgd", "node_in_use", "best_fit_unpinned"]
    assert all(weights[a] >= 1e3 * weights[b] for a, b in pairwise(order))
    assert set(order) < set(DEFAULT_POLICY.truncated)


def test_a_pool_still_on_the_previous_default_places_as_it_did():
    previous = dict(DEFAULT_POLICY.weights)
    previous["paper_fgd"] = previous.pop("memory_fgd")
    assert "paper_fgd" in policy_from(previous).truncated


def test_policy_from_keeps_everything_but_what_it_is_given():
    policy = policy_from({"bin_pack": 2}, version=4, allow_tenant_mixing=True)
    assert policy.weights == {"bin_pack": 2.0} and policy.version == 4
    assert policy.allow_tenant_mixing and policy.filters == DEFAULT_POLICY.filters
    assert policy.gpu_choice == DEFAULT_POLICY.gpu_choice
    assert policy_from(dict(DEFAULT_POLICY.weights)) == DEFAULT_POLICY
    assert policy_from({"bin_pack": 1}, ["capacity"]).filters == ("capacity",)


@pytest.mark.parametrize(
    ("weights", "filters", "field", "says"),
    [
        ({"binpack": 0.2}, None, "weights", "'binpack' is unknown"),
        ({"bin_pack": -1}, None, "weights", "between 0 and"),
        ({"bin_pack": math.inf}, None, "weights", "between 0 and"),
        ({"bin_pack": 1e13}, None, "weights", "between 0 and"),
        ({"bin_pack": "1"}, None, "weights", "must be a number"),
        ({"bin_pack": True}, None, "weights", "must be a number"),
        ({}, None, "weights", "non-empty"),
        ([1], None, "weights", "non-empty"),
        ({"bin_pack": 1}, ["no_such_filter"], "filters", "'no_such_filter' is unknown"),
        ({"bin_pack": 1}, ["capacity", "capacity"], "filters", "once"),
        ({"bin_pack": 1}, "capacity", "filters", "A list"),
    ],
)
def test_unknown_names_and_bad_weights_are_refused(weights, filters, field, says):
    problems = policy_problems(weights, filters)
    assert list(problems) == [field] and says in " ".join(problems[field])
    with pytest.raises(ValueError, match=field):
        policy_from(weights, filters)
