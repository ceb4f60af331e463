"""The snapshot's rows as the core sees them: nodes, GPUs, lease ends, labels and NUMA layouts
as core views (the conventions are in `leases.snapshot`'s docstring and docs/leases.md).
Pure functions of the rows `leases.snapshot_rows` reads."""

from __future__ import annotations

from datetime import datetime

from nodes.choices import NodeState, Reachability
from placement import types as core
from placement.mig import profiles_for
from pools.validation import parse_energy_class, parse_price


def mig_slices_from_mask(mask: int) -> tuple[core.MigSlice, ...]:
    # A slot per bit: `occupied_slices` counts an unknown profile as one slice.
    return tuple(core.MigSlice("", bit) for bit in range(8) if mask >> bit & 1)


def mig_mask(model: str, memory_mib: int, profile: str, start: int) -> int:
    size = profiles_for(model, memory_mib)[profile].slices
    return ((1 << size) - 1) << start


def mig_layout(slices) -> tuple[core.MigSlice, ...] | None:
    """The device's real MIG layout from its reported instances (profile and start each, as
    the agent reads them through NVML); None when it is not known — no instance reported, or
    one without its start (an agent that cannot read placements) —, where the core assumes any
    valid start can be carved."""
    if not isinstance(slices, list) or not slices:
        return None
    layout = []
    for s in slices:
        start = s.get("start") if isinstance(s, dict) else None
        if not isinstance(start, int) or not s.get("profile"):
            return None
        layout.append(core.MigSlice(str(s["profile"]), start))
    return tuple(sorted(layout, key=lambda m: m.start))


def gpu_view(row: dict, *, empty: bool = False) -> core.GpuView:
    if row["mig_enabled"]:
        mask = 0 if empty else row["mig_slots_used"]
        slices = mig_slices_from_mask(mask)
        return core.GpuView(
            index=row["index"],
            model=row["model"],
            memory_mib=row["memory_mib"],
            free_milli=max(0, 1000 - 125 * len(slices)),
            sharing=core.MIG,
            uuid=row["uuid"],
            mig_slices=slices,
            mig_layout=mig_layout(row.get("mig_slices")),
            interconnect_group=row["interconnect_group"],
            numa_node=row["numa_node"] or 0,
            healthy=row["healthy"],
            driver_version=row["driver_version"],
            cuda_version=row["cuda_version"],
            compute_capability=row.get("compute_capability") or "",
        )
    tenant = row["share_tenant_id"]
    return core.GpuView(
        index=row["index"],
        model=row["model"],
        memory_mib=row["memory_mib"],
        free_milli=1000 if empty else 1000 - row["milli_reserved"],
        sharing=row["sharing_mode"],
        uuid=row["uuid"],
        interconnect_group=row["interconnect_group"],
        numa_node=row["numa_node"] or 0,
        healthy=row["healthy"],
        driver_version=row["driver_version"],
        cuda_version=row["cuda_version"],
        compute_capability=row.get("compute_capability") or "",
        tenants=(str(tenant),) if tenant is not None and not empty else (),
    )


def lease_ends(leases) -> tuple[core.LeaseEnd, ...]:
    """Holding leases of a node (JSON rows of `snapshot_rows.read`) as core lease ends, earliest
    first."""
    ends = []
    for lease in leases or ():
        ends_at = lease["ends_at"]
        if isinstance(ends_at, str):
            ends_at = datetime.fromisoformat(ends_at)
        ends.append(
            core.LeaseEnd(
                lease_id=str(lease["id"]),
                ends_at=ends_at,
                tenant=str(lease["tenant"]),
                cpu_millicores=lease["cpu_millicores"],
                memory_mib=lease["memory_mib"],
                scratch_mib=lease["scratch_mib"],
                gpu_milli=tuple(
                    (a["index"], a["milli"])
                    for a in lease["gpu_allocations"] or ()
                    if not a.get("mig_slots")
                ),
                mig_slots=tuple(
                    (a["index"], a["mig_slots"])
                    for a in lease["gpu_allocations"] or ()
                    if a.get("mig_slots")
                ),
            )
        )
    return tuple(sorted(ends, key=lambda x: (x.ends_at, x.lease_id)))


PRICE_LABEL = "computepool.io/price-per-hour"
ENERGY_LABEL = "computepool.io/energy-class"


def node_price(price_class: str, labels: dict) -> float:
    """The node's price per hour: its `price_class` (checked at enrollment), else its
    `computepool.io/price-per-hour` label; 0.0 when neither parses."""
    for text in (price_class, labels.get(PRICE_LABEL)):
        if text not in (None, "") and (price := parse_price(text)) is not None:
            return price
    return 0.0


def node_energy_class(energy_class: str, labels: dict) -> int:
    """The node's energy class: its `energy_class` (checked at enrollment), else its label."""
    if energy_class and (value := parse_energy_class(energy_class)) is not None:
        return value
    return parse_energy_class(labels.get(ENERGY_LABEL, "")) or 0


def label_pairs(labels) -> frozenset[str]:
    if not isinstance(labels, dict):
        return frozenset()
    return frozenset(f"{k}={v}" for k, v in labels.items() if isinstance(v, str | int | float))


def node_features(features) -> frozenset[str]:
    """A node's `features` as the scheduler reads them: the strings of a list (what enrollment
    and heartbeats validate; anything else stored before they did is ignored, never a crash)."""
    if not isinstance(features, list):
        return frozenset()
    return frozenset(f for f in features if isinstance(f, str))


def cached_data(data) -> frozenset[tuple[str, int]]:
    """{key: bytes} as the core's (key, bytes) pairs; what does not parse is left out."""
    if not isinstance(data, dict):
        return frozenset()
    return frozenset((k, v) for k, v in data.items() if _int(v) is not None)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _numa_views(row: dict, work, free_cpu: int, free_mem: int) -> tuple[core.NumaView, ...]:
    """The node's NUMA layout as core views, free = size − what leases pinned there hold,
    capped at the node's free capacity. Entries that do not parse are left out."""
    layout = row.get("numa_layout")
    if not isinstance(layout, list):
        return ()
    used: dict[int, tuple[int, int]] = {}
    for item in work:
        numa = _int(item.get("numa"))
        if numa is not None and not item.get("backfill"):
            cpu, mem = used.get(numa, (0, 0))
            used[numa] = (cpu + (_int(item.get("cpu")) or 0), mem + (_int(item.get("mem")) or 0))
    views, seen = [], set()
    for entry in layout:
        if not isinstance(entry, dict) or _int(entry.get("id")) is None or entry["id"] in seen:
            continue
        cpus = entry.get("cpus")
        count = len(cpus) if isinstance(cpus, list) else _int(cpus)
        if count is None:
            continue
        memory = _int(entry.get("memory_mib"))
        cpu_used, mem_used = used.get(entry["id"], (0, 0))
        seen.add(entry["id"])
        views.append(
            core.NumaView(
                id=entry["id"],
                free_cpu_millicores=max(0, min(free_cpu, count * 1000 - cpu_used)),
                free_memory_mib=max(
                    0, free_mem if memory is None else min(free_mem, memory - mem_used)
                ),
            )
        )
    return tuple(sorted(views, key=lambda v: v.id))


def node_view(
    row: dict, gpus: list[dict], *, empty: bool = False, zone_labels: frozenset = frozenset()
) -> core.NodeView:
    """`zone_labels`: the labels of the work on the nodes of its zone (`zone_work_labels`)."""
    labels = row["labels"] if isinstance(row["labels"], dict) else {}
    work = [] if empty else [w for w in row.get("work") or () if isinstance(w, dict)]
    cpu, mem, scratch = (
        row["cpu_millicores_allocatable"],
        row["memory_mib_allocatable"],
        row["scratch_mib_allocatable"],
    )
    return core.NodeView(
        name=row["name"],
        cpu_millicores=cpu,
        memory_mib=mem,
        scratch_mib=scratch,
        free_cpu_millicores=cpu if empty else cpu - row["cpu_millicores_reserved"],
        free_memory_mib=mem if empty else mem - row["memory_mib_reserved"],
        free_scratch_mib=scratch if empty else scratch - row["scratch_mib_reserved"],
        gpus=tuple(gpu_view(g, empty=empty) for g in gpus),
        state=NodeState.READY if empty else row["state"],
        reachable=empty or row["reachability"] == Reachability.REACHABLE,
        labels={str(k): str(v) for k, v in labels.items()},
        price_per_hour=node_price(row["price_class"], labels),
        energy_class=node_energy_class(row["energy_class"], labels),
        trust_level=row["trust_level"],
        workload_labels=frozenset().union(*(label_pairs(w.get("labels")) for w in work)),
        zone_workload_labels=frozenset() if empty else zone_labels,
        numa=_numa_views(
            row,
            work,
            cpu if empty else cpu - row["cpu_millicores_reserved"],
            mem if empty else mem - row["memory_mib_reserved"],
        ),
        arch=row["architecture"],
        os=row["os"],
        runtimes=frozenset(row["runtimes"] or ("docker",)),
        region=row["region"],
        zone=row["zone"],
        rack=row["rack"],
        network_class=row["network_class"],
        features=node_features(row["features"]),
        # the image digests the node's agent reports in its cache (heartbeats)
        warm_images=frozenset(row["cached_images"] or ()),
        # what its caches hold of the data the requests at hand need (snapshot_rows: `data`),
        # and its measured throughput (docs/storage.md "Data locality")
        cached_data=cached_data(row.get("data")),
        pull_bytes_per_s=float(row.get("pull_bytes_per_s") or 0.0),
        download_bytes_per_s=float(row.get("download_bytes_per_s") or 0.0),
        leases=() if empty else lease_ends(row.get("leases")),
    )
