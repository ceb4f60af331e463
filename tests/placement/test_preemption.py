"""Choosing what to preempt (placement/preemption.py): only eligible work, on the node
where its end makes room, the cheapest set first."""

from dataclasses import replace

from placement import DEFAULT_POLICY, Placement, Request, place
from placement.preemption import Candidate, choose_victims, free_leases, lost_work
from placement.types import LeaseEnd

from .factories import gpu_node

NOW = 100_000.0
HOUR = 3600.0


def busy(name="gpu-1", leases=(), gpus=4):
    """A GPU node whose devices and CPU are held by `leases` (LeaseEnds)."""
    node = gpu_node(name, gpus=gpus)
    held = {i for x in leases for i, _ in x.gpu_milli}
    devices = tuple(replace(g, free_milli=0) if g.index in held else g for g in node.gpus)
    cpu = sum(x.cpu_millicores for x in leases)
    mem = sum(x.memory_mib for x in leases)
    return replace(
        node,
        gpus=devices,
        free_cpu_millicores=node.cpu_millicores - cpu,
        free_memory_mib=node.memory_mib - mem,
        leases=tuple(leases),
    )


def held(lease_id, *devices, cpu=1000):
    return LeaseEnd(
        str(lease_id), NOW + HOUR, cpu_millicores=cpu, memory_mib=1024,
        gpu_milli=tuple((i, 1000) for i in devices),
    )  # fmt: skip


def victim(job, node, lease, *, priority=10, age=HOUR, checkpointed_ago=None, **fields):
    return Candidate(
        job=job,
        node=node,
        lease=lease,
        priority=priority,
        preemptible=fields.pop("preemptible", True),
        checkpointable=fields.pop("checkpointable", True),
        started_at=NOW - age,
        checkpointed_at=None if checkpointed_ago is None else NOW - checkpointed_ago,
        **fields,
    )


def urgent(gpus=1, priority=100):
    return Request(cpu_millicores=1000, memory_mib=1024, gpu_count=gpus, priority=priority)


def choose(req, nodes, candidates, **kw):
    return choose_victims(req, nodes, candidates, DEFAULT_POLICY, now=NOW, **kw)


def full_node_of_four():
    leases = [held(i, i) for i in range(4)]
    return busy(leases=leases), leases


def test_a_lower_priority_checkpointable_job_is_chosen():
    node, leases = full_node_of_four()
    candidates = [victim(10 + i, node.name, x) for i, x in enumerate(leases)]
    chosen = choose(urgent(), [node], candidates)
    assert chosen.node == "gpu-1" and [v.job for v in chosen.victims] == [10]


def test_only_eligible_work_is_preempted():
    """Equal or higher priority, a class that is not preemptible, work that cannot checkpoint
    and fresh work under the minimum runtime are all left alone."""
    node, leases = full_node_of_four()
    candidates = [
        victim(10, node.name, leases[0], priority=100),  # not lower than the request
        victim(11, node.name, leases[1], preemptible=False),
        victim(12, node.name, leases[2], checkpointable=False),
        victim(13, node.name, leases[3], age=299),  # under the default 300 s
    ]
    assert choose(urgent(), [node], candidates) is None
    # the minimum runtime is the caller's knob
    assert [v.job for v in choose(urgent(), [node], candidates, min_runtime_s=60).victims] == [13]
    old_enough = [*candidates[:3], replace(candidates[3], started_at=NOW - 300)]
    assert [v.job for v in choose(urgent(), [node], old_enough).victims] == [13]


def test_the_most_recently_checkpointed_victim_goes_first():
    node, leases = full_node_of_four()
    candidates = [
        victim(10, node.name, leases[0], checkpointed_ago=1800),
        victim(11, node.name, leases[1], checkpointed_ago=60),  # least work lost
        victim(12, node.name, leases[2]),  # never checkpointed: an hour since it started
        victim(13, node.name, leases[3], checkpointed_ago=600),
    ]
    chosen = choose(urgent(), [node], candidates)
    assert [v.job for v in chosen.victims] == [11]
    assert chosen.lost_work == lost_work(candidates[1], node, NOW) == 60 * 0.25


def test_lower_priority_is_preferred_over_less_lost_work():
    node, leases = full_node_of_four()
    candidates = [
        victim(10, node.name, leases[0], priority=50, checkpointed_ago=1),
        victim(11, node.name, leases[1], priority=5),  # an hour of work, but lower
        victim(12, node.name, leases[2], priority=50),
        victim(13, node.name, leases[3], priority=50),
    ]
    assert [v.job for v in choose(urgent(), [node], candidates).victims] == [11]


def test_only_the_victims_the_request_needs_are_taken():
    """Two GPUs wanted: the two cheapest whole-GPU jobs, not a third."""
    node, leases = full_node_of_four()
    candidates = [victim(10 + i, node.name, x, age=HOUR * (i + 1)) for i, x in enumerate(leases)]
    chosen = choose(urgent(gpus=2), [node], candidates)
    assert [v.job for v in chosen.victims] == [10, 11]


def test_a_victim_taken_early_is_spared_when_a_later_one_alone_makes_room():
    """The cheapest job holds one GPU; two GPUs are wanted and the next holds two: the one
    two-GPU job suffices, so the first is spared."""
    small, pair = held(1, 0), held(2, 1, 2)
    node = busy(leases=[small, pair, held(3, 3)])
    candidates = [
        victim(10, node.name, small, age=60 * 10),
        victim(11, node.name, pair, age=60 * 20),
        victim(12, node.name, node.leases[2], priority=100),
    ]
    assert [v.job for v in choose(urgent(gpus=2), [node], candidates).victims] == [11]


def test_fewest_victims_break_a_tie_of_lost_work():
    """On node a one job holding two GPUs, on node b two jobs of one GPU each, all started at
    the same time: the same lost work, so the node with fewer victims wins."""
    a = busy("a", [held("a1", 0, 1), held("a2", 2, 3)])
    b = busy("b", [held("b1", 0), held("b2", 1), held("b3", 2, 3)])
    candidates = [
        victim(1, "a", a.leases[0]),
        victim(2, "a", a.leases[1], priority=100),
        victim(3, "b", b.leases[0]),
        victim(4, "b", b.leases[1]),
        victim(5, "b", b.leases[2], priority=100),
    ]
    chosen = choose(urgent(gpus=2), [b, a], candidates)
    assert chosen.node == "a" and [v.job for v in chosen.victims] == [1]


def test_nothing_when_even_all_eligible_victims_gone_would_not_make_room():
    node, leases = full_node_of_four()
    candidates = [victim(10, node.name, leases[0]), victim(11, node.name, leases[1])]
    assert choose(urgent(gpus=3), [node], candidates) is None
    assert choose(urgent(gpus=5), [node], candidates) is None  # more than the node has
    assert choose(replace(urgent(), replicas=2), [node], candidates) is None  # gangs


def test_freeing_the_victims_makes_the_request_fit_in_the_core():
    node, leases = full_node_of_four()
    candidates = [victim(10 + i, node.name, x) for i, x in enumerate(leases)]
    chosen = choose(urgent(), [node], candidates)
    assert not place(urgent(), [node], DEFAULT_POLICY)
    freed = free_leases([node], [v.lease.lease_id for v in chosen.victims])
    placement = place(urgent(), freed, DEFAULT_POLICY)
    assert isinstance(placement, Placement) and placement.devices[0].index == 0
    assert [x.lease_id for x in freed[0].leases] == ["1", "2", "3"]


def test_the_choice_is_deterministic():
    nodes = [busy(n, [held(f"{n}{i}", i) for i in range(4)]) for n in ("c", "a", "b")]
    candidates = [victim(i, n.name, x) for i, (n, x) in enumerate(
        (n, x) for n in nodes for x in n.leases
    )]  # fmt: skip
    first = choose(urgent(), nodes, candidates)
    assert first == choose(urgent(), list(reversed(nodes)), list(reversed(candidates)))
    assert first.node == "a"
