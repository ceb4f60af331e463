"""Replay of the OpenB GPU-cluster trace through the scheduler core (FGD paper protocol), and the
paper's policies it compares the product default with.

See ``../shared/benchmarks/openb/PROTOCOL.md``. ``trace`` reads the CSVs and orders arrivals
and nodes, ``variants`` resamples a trace into mixes that are not given, ``policies`` names the
policies, ``run`` replays and reports. This package may use
numpy; the core it drives does not.

Node order: ties go to the smallest node name, but the paper's simulator renames every node
before the run with a random-permutation prefix (``syncClusterResourceList`` in
``pkg/simulator/simulator.go``: nodes sorted by name, then ``"%04d-" % perm[i] + name``), so the
tie order is a random permutation of the cluster drawn once per run, not the CSV order that
PROTOCOL.md describes. ``node_order`` does the same with a seeded RNG of its own. The policies
whose scores tie most (GpuClustering, GpuPacking: every CPU-only pod scores 0 everywhere) are
the ones this moves: in CSV order they pile CPU-only pods onto the first nodes of the file and
come out 0.6-1.2 points below the published means.
"""

from .policies import PAPER_POLICIES, POLICY_NAMES, for_trace, policy_for
from .run import RunResult, curve_from_events, parse_seeds, replay, replay_run, summarize
from .trace import (
    Pod,
    build_arrivals,
    node_order,
    pod_request,
    read_nodes,
    read_pods,
    typical_workload,
)
from .variants import VARIANTS, make_variant

__all__ = [
    "PAPER_POLICIES",
    "POLICY_NAMES",
    "VARIANTS",
    "Pod",
    "RunResult",
    "build_arrivals",
    "curve_from_events",
    "for_trace",
    "make_variant",
    "node_order",
    "parse_seeds",
    "pod_request",
    "policy_for",
    "read_nodes",
    "read_pods",
    "replay",
    "replay_run",
    "summarize",
    "typical_workload",
]
