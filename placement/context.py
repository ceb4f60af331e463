"""What scoring a request needs besides the node: the fit being scored and the pass context."""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random

from .fragmentation import Workload, generic_workload
from .types import NodeView, Policy


@dataclass(slots=True)
class Fit:
    """One way to place a request on a node: the devices and the node's capacity after."""

    devices: tuple  # tuple[DeviceShare, ...]
    cpu: int  # reserved amounts (granted)
    memory: int
    scratch: int
    frees_before: tuple[int, ...]
    frees_after: tuple[int, ...]
    numa_node: int | None = None  # set when the request required NUMA alignment


@dataclass(slots=True)
class ScoreContext:
    policy: Policy
    workload: Workload
    max_cpu: int = 1
    max_gpu_milli: int = 1
    peers: tuple[NodeView, ...] = ()  # nodes already holding replicas of the same gang/group
    rng: Random = field(default_factory=Random)
    filters: tuple = (None, (), (), ())  # (request, filter checks that apply to it)
    active: tuple = (None, ())  # (request, scorers that can tell nodes apart for it)
    # (request key, id(node)) -> (node, evaluation): a NodeView is immutable, and
    # apply_to_nodes keeps unchanged nodes as the same objects, so placing many requests on one
    # snapshot re-evaluates only the nodes that changed.
    evaluations: dict = field(default_factory=dict)
    # data key → bytes, the largest any node of the pass reports holding (data_locality)
    data_sizes: dict = field(default_factory=dict)


_GENERIC = generic_workload()


def make_context(nodes, policy: Policy, peers=(), rng: Random | None = None) -> ScoreContext:
    """Build once per pass and pass to ``place`` when placing many requests on one snapshot."""
    max_cpu = max((n.cpu_millicores for n in nodes), default=1) or 1
    max_gpu = max((1000 * len(n.gpus) for n in nodes), default=1000) or 1000
    return ScoreContext(
        policy=policy,
        workload=policy.workload or _GENERIC,
        max_cpu=max_cpu,
        max_gpu_milli=max_gpu,
        peers=tuple(peers),
        rng=rng or Random(policy.seed),
        data_sizes=data_sizes(nodes),
    )


def data_sizes(nodes) -> dict[str, int]:
    """key → bytes, the largest any of `nodes` reports holding in its caches."""
    sizes: dict[str, int] = {}
    for node in nodes:
        for key, size in node.cached_data:
            if size > sizes.get(key, -1):
                sizes[key] = size
    return sizes
