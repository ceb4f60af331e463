"""The MIG layout plan (placement/mig.py plan_layouts): which idle GPUs to carve anew, and into
what, for the slices queued work waits for. Pure. UNVERIFIED ON HARDWARE: what it asks is
carried out by the agent (tested against a fake NVML, tests/worker_agent/test_mig.py)."""

from types import SimpleNamespace

import pytest

from nodes.services.mig import layout_problems
from placement.mig import (
    LayoutRules,
    MigGpu,
    MigWait,
    plan_layouts,
    profiles_for,
    valid_layouts,
)
from placement.types import MigSlice

WHOLE = (MigSlice("7g.80gb", 0),)
HALVES = (MigSlice("3g.40gb", 0), MigSlice("3g.40gb", 4))
RULES = LayoutRules(max_gpus=2, min_wait_s=60, settle_s=600, pending_trust_s=600)


def idle(uuid="g0", layout=WHOLE, model="H100-80GB", **fields) -> MigGpu:
    return MigGpu(uuid, model, 81559, layout=layout, **fields)


def wait(profile="1g.10gb", slices=1, waited_s=120.0, **fields) -> MigWait:
    return MigWait(profile, slices, waited_s, **fields)


def profiles_of(layout) -> list[str]:
    return [s.profile for s in layout]


@pytest.mark.parametrize("model", ["H100-80GB", "A100-40GB", "H200-141GB"])
def test_every_layout_it_may_choose_is_one_the_request_service_takes(model):
    gpu = SimpleNamespace(model=model, memory_mib=0)  # what layout_problems reads of a row
    layouts = valid_layouts(model)
    assert len(layouts) > 100
    assert (MigSlice(next(n for n in profiles_for(model) if n.startswith("7g")), 0),) in layouts
    for layout in layouts:
        as_asked = [{"profile": s.profile, "start": s.start} for s in layout]
        assert layout_problems(gpu, as_asked) == ""


def test_the_waiting_profile_is_carved_on_an_idle_gpu():
    [choice] = plan_layouts([wait("1g.10gb", 2)], [idle()], RULES)
    assert choice.uuid == "g0"
    assert profiles_of(choice.layout) == ["1g.10gb"] * 7  # the rest in the waiting profile too
    assert choice.serves == {"1g.10gb": 2}


def test_mixed_demand_is_served_by_one_layout_weighted_by_compute():
    [choice] = plan_layouts([wait("3g.40gb"), wait("1g.10gb", 3)], [idle()], RULES)
    # 1g at 0-3 and 3g at 4: the fourth 1g is carved in a waiting profile too
    assert sorted(profiles_of(choice.layout)) == ["1g.10gb"] * 4 + ["3g.40gb"]
    assert choice.serves == {"3g.40gb": 1, "1g.10gb": 3}


def test_never_a_gpu_with_a_lease():
    busy = idle("busy", layout=WHOLE, idle=False, used=frozenset(range(8)))
    assert plan_layouts([wait("1g.10gb", 4)], [busy], RULES) == []
    # a lease on another instance of it counts too: the GPU is not idle
    half_busy = idle("half", layout=HALVES, idle=False, used=frozenset(range(4)))
    assert plan_layouts([wait("1g.10gb")], [half_busy], RULES) == []
    [choice] = plan_layouts([wait("1g.10gb")], [half_busy, idle("free")], RULES)
    assert choice.uuid == "free"


def test_a_free_instance_of_the_profile_anywhere_serves_the_demand_first():
    half_busy = idle("half", layout=HALVES, idle=False, used=frozenset(range(4)))
    assert plan_layouts([wait("3g.40gb")], [half_busy, idle("free")], RULES) == []
    [choice] = plan_layouts([wait("3g.40gb", 2)], [half_busy, idle("free")], RULES)
    assert choice.uuid == "free" and choice.serves == {"3g.40gb": 1}


def test_nothing_without_demand_or_before_it_waited_long_enough():
    assert plan_layouts([], [idle()], RULES) == []
    assert plan_layouts([wait(waited_s=59)], [idle()], RULES) == []
    assert plan_layouts([wait(waited_s=60)], [idle()], RULES) != []


def test_a_gpu_whose_layout_already_serves_the_demand_is_left_alone():
    # its 3g instances are what waits (a lease holds them, say): it is not carved into 1g
    serving = idle("serving", layout=HALVES)
    assert plan_layouts([wait("3g.40gb", 3), wait("1g.10gb")], [serving], RULES) == []


def test_a_gpu_asked_recently_or_still_pending_is_not_asked_again():
    recent = idle("recent", since_request_s=599)
    assert plan_layouts([wait()], [recent], RULES) == []
    assert plan_layouts([wait()], [idle("settled", since_request_s=600)], RULES) != []
    # asked for a layout it has not reported yet: not asked again, whatever waits
    pending = idle("pending", since_request_s=3600, requested=(MigSlice("2g.20gb", 0),))
    assert plan_layouts([wait()], [pending], RULES) == []


def test_a_pending_layout_counts_as_coming_only_for_a_while():
    asked = (MigSlice("1g.10gb", 0),)
    fresh = idle("pending", since_request_s=30, requested=asked)
    assert plan_layouts([wait()], [fresh, idle("other")], RULES) == []
    # never reported long after the ask (the agent refused): the demand goes elsewhere, the
    # pending GPU is still not asked again
    stale = idle("pending", since_request_s=3600, requested=asked)
    [choice] = plan_layouts([wait()], [stale, idle("other")], RULES)
    assert choice.uuid == "other"


def test_at_most_max_gpus_and_only_while_demand_is_left():
    gpus = [idle(f"g{i}") for i in range(5)]
    chosen = plan_layouts([wait("7g.80gb", 5)], gpus, RULES)
    # the whole-GPU profile is what these GPUs hold: they serve it already
    assert chosen == []
    chosen = plan_layouts([wait("4g.40gb", 5)], gpus, RULES)
    assert [c.uuid for c in chosen] == ["g0", "g1"]
    assert plan_layouts([wait("4g.40gb", 1)], gpus, RULES)[0].serves == {"4g.40gb": 1}
    assert len(plan_layouts([wait("4g.40gb", 1)], gpus, RULES)) == 1


def test_instances_of_the_current_layout_are_kept_where_they_can_be():
    # nothing waits for 4g or 3g; one 1g waits: one half is kept, the other carved in 1g
    current = (MigSlice("4g.40gb", 0), MigSlice("3g.40gb", 4))
    [choice] = plan_layouts([wait("1g.10gb")], [idle(layout=current)], RULES)
    kept = [s for s in choice.layout if s in current]
    assert len(kept) == 1
    assert {s.profile for s in choice.layout if s not in current} == {"1g.10gb"}
    # both halves kept would serve nothing: the layout that serves the wait wins
    assert choice.serves == {"1g.10gb": 1}


def test_a_gpu_of_a_model_without_the_profile_or_with_an_unknown_layout_is_not_chosen():
    a100_40 = idle("a100", model="A100-40GB", layout=(MigSlice("7g.40gb", 0),))
    assert plan_layouts([wait("3g.40gb")], [a100_40], RULES) == []  # an 80 GB profile
    [choice] = plan_layouts([wait("3g.20gb")], [a100_40], RULES)
    assert choice.uuid == "a100"
    assert plan_layouts([wait()], [idle(layout=None)], RULES) == []


def test_a_wait_for_other_models_is_not_served_here():
    assert plan_layouts([wait(models=("A100-80GB",))], [idle()], RULES) == []
    assert plan_layouts([wait(models=("H100-80GB",))], [idle()], RULES) != []


def test_the_plan_is_deterministic():
    gpus = [idle(f"g{i}") for i in range(4)]
    demand = [wait("2g.20gb", 2), wait("1g.10gb", 3), wait("3g.40gb")]
    assert plan_layouts(demand, gpus, RULES) == plan_layouts(demand, gpus, RULES)
