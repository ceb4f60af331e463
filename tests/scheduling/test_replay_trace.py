"""The replay_trace command: a named policy, or the policy a pool places with."""

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from placement import policy_from
from pools.services import policy_version_publish
from scheduling.replay import make_variant, read_nodes, read_pods, replay_run

FIXTURES = Path(__file__).parent / "replay" / "fixtures"
TINY_NODES = str(FIXTURES / "openb_tiny_nodes.csv")
TINY_PODS = str(FIXTURES / "openb_tiny_pods.csv")


def test_replay_trace_command_prints_one_json_object():

    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "replay_trace",
        "--nodes",
        TINY_NODES,
        "--pods",
        TINY_PODS,
        "--policy",
        "fgd",
        "--seeds",
        "42-43",
        "--json",
        stdout=out,
    )
    result = json.loads(out.getvalue())
    assert result["policy"] == "fgd" and result["seeds"] == [42, 43]
    assert result["failed_pods"] == {"42": 2, "43": 3}
    assert set(result["alloc_at"]) == {"100", "130"}


def replay_json(*args):
    out = io.StringIO()
    call_command(
        "replay_trace", "--nodes", TINY_NODES, "--pods", TINY_PODS, *args, "--json", stdout=out
    )
    return json.loads(out.getvalue())


def outcome(result):
    return {k: v for k, v in result.items() if k not in ("policy", "seconds", "seconds_per_run")}


@pytest.mark.django_db
def test_a_pool_on_the_default_policy_replays_exactly_like_the_default(pool):
    by_pool = replay_json("--pool", pool.slug, "--seeds", "42-43")
    assert by_pool["policy"] == "pool test v1"
    assert outcome(by_pool) == outcome(replay_json("--policy", "default", "--seeds", "42-43"))


@pytest.mark.django_db
def test_a_pool_replays_its_newest_version(pool, system):
    weights = {"paper_best_fit": 1.0}
    policy_version_publish(policy=pool.scheduling_policy, weights=weights, actor=system)
    by_pool = replay_json("--pool", pool.slug, "--seeds", "42")
    assert by_pool["policy"] == "pool test v2"
    expected = replay_run(
        read_nodes(TINY_NODES), read_pods(TINY_PODS), policy_from(weights, version=2), 42
    )
    assert by_pool["failed_pods"] == {"42": expected.failed_pods}


def test_a_variant_replays_each_seeds_resample_of_the_trace():
    # share100 on the fixture: every GPU pod becomes one of its sharing pods, so the demand and
    # the report differ from the trace's; the same seed gives the same result.
    plain = replay_json("--policy", "fgd", "--seeds", "42")
    shared = replay_json("--policy", "fgd", "--seeds", "42", "--variant", "share100")
    assert shared["trace"] == "openb_tiny_pods+share100"
    assert outcome(shared) != outcome(plain) | {"trace": shared["trace"]}
    again = replay_json("--policy", "fgd", "--seeds", "42", "--variant", "share100")
    assert outcome(again) == outcome(shared)
    expected = replay_run(
        read_nodes(TINY_NODES), make_variant(read_pods(TINY_PODS), "share100", 42), "fgd", 42
    )
    assert shared["failed_pods"] == {"42": expected.failed_pods}
    assert shared["pods"] == {"42": expected.pods}


def test_an_unknown_variant_is_an_error():
    with pytest.raises(CommandError, match="invalid choice"):
        replay_json("--variant", "cpu99")


@pytest.mark.django_db
def test_an_unknown_pool_is_an_error():
    with pytest.raises(CommandError, match="no pool 'nope'"):
        replay_json("--pool", "nope")
