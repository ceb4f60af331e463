"""Small builders for pure scheduler-core tests (no database)."""

from placement import FILTERS, make_context
from placement.context import Fit
from placement.fragmentation import Shape, Workload
from placement.types import GpuView, NodeView, Policy


def gpu_node(
    name="gpu-1",
    gpus=4,
    model="A100-80GB",
    memory_mib=81920,
    sharing="exclusive",
    cpu=64000,
    mem=262144,
    scratch=1_000_000,
    group="",
    **extra,
) -> NodeView:
    devices = tuple(
        GpuView(
            i,
            model=model,
            memory_mib=memory_mib,
            sharing=sharing,
            interconnect_group=group,
            uuid=f"{name}-gpu{i}",
        )
        for i in range(gpus)
    )
    return NodeView(
        name=name, cpu_millicores=cpu, memory_mib=mem, scratch_mib=scratch, gpus=devices, **extra
    )


def cpu_node(name="cpu-1", cpu=32000, mem=131072, **extra) -> NodeView:
    return NodeView(name=name, cpu_millicores=cpu, memory_mib=mem, scratch_mib=100_000, **extra)


POLICY = Policy(name="test", version=7, weights={"fragmentation": 1.0, "bin_pack": 0.1})


# A typical workload of half-GPU shares and whole GPUs, for fragmentation-aware tests.
SHARE = Shape(4000, 500, 1)
WHOLE = Shape(8000, 1000, 1)
WORKLOAD = Workload((SHARE, WHOLE), (0.5, 0.5))


def ctx_for(nodes, **weights):
    """A scoring context over ``nodes`` (weights default to the fragmentation scorer)."""
    policy = Policy(weights=weights or {"fragmentation": 1.0}, workload=WORKLOAD)
    return make_context(nodes, policy)


def fit_on(node, cpu=0, mem=0, frees_after=None):
    """A fit on ``node`` that takes ``cpu``/``mem`` and leaves ``frees_after`` (default: as is)."""
    frees = tuple(g.free_milli for g in node.gpus)
    return Fit((), cpu, mem, 0, frees, frees if frees_after is None else frees_after)


def refusal(filter_name, request, node, policy=POLICY):
    """What the registered filter ``filter_name`` says about ``node`` (None: it passes)."""
    return FILTERS[filter_name].check(request, node, policy)
