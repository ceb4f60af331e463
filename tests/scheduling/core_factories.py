"""Small builders for pure scheduler-core tests (no database)."""

from scheduling.core.types import GpuView, NodeView, Policy


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
