"""The thin adapter between the database and the pure scheduler core.

`pool_snapshot` reads the schedulable (ready and reachable) nodes of a pool and their GPUs in two
plain queries, with no locks, and turns them into core `NodeView`s whose free capacity is
allocatable − reserved. The snapshot may be stale by the time it is used; the apply step in
`leases.services` guards every capacity change with a compare-and-set UPDATE, so staleness
costs a retry, never an overcommit.

Conventions of the adapter (documented in docs/leases.md):
- node names are unique within a pool, so a `NodeView.name` is the node's name;
- a GPU's sharing mode: MIG when `mig_enabled`, else its `sharing_mode` field
  (`exclusive` | `timeslice` | `mps`);
- MIG slices in use come from the `mig_slots_used` bitmask (one slot per bit);
- tenants are identified by their primary key as a string;
- a node's price and energy class come from its labels `computepool.io/price-per-hour` (a
  finite number ≥ 0) and `computepool.io/energy-class` (an integer 0…9 or a letter A…G, 0 = A =
  most efficient); a value that does not parse is ignored (0), never an error;
- a node's workload labels are the `labels` of the requests of its holding leases (a job's
  labels, "key=value"), read in the same query as the node;
- its NUMA nodes come from `numa_layout` (`cpus` a count or a list of ids, `memory_mib`), each
  minus what holding leases pinned to it hold and never above the node's free capacity.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

import orjson
from django.db import connection

from leases.choices import HOLDING
from leases.models import Lease
from nodes.choices import SCHEDULABLE, NodeState, Reachability
from nodes.models import GpuDevice, Node
from placement import types as core
from placement.mig import profiles_for
from pools.choices import GpuSharingClass
from pools.knobs import pool_policy as pool_policy  # the core's policy of a pool, re-exported

_NODE_FIELDS = (
    "id",
    "name",
    "state",
    "reachability",
    "architecture",
    "os",
    "runtimes",
    "cached_images",
    "labels",
    "region",
    "zone",
    "rack",
    "network_class",
    "numa_layout",
    "cpu_millicores_allocatable",
    "memory_mib_allocatable",
    "scratch_mib_allocatable",
    "cpu_millicores_reserved",
    "memory_mib_reserved",
    "scratch_mib_reserved",
)
_GPU_FIELDS = (
    "id",
    "node_id",
    "index",
    "uuid",
    "model",
    "memory_mib",
    "mig_enabled",
    "sharing_mode",
    "interconnect_group",
    "numa_node",
    "healthy",
    "driver_version",
    "cuda_version",
    "milli_reserved",
    "mig_slots_used",
    "share_tenant_id",
)


class Snapshot:
    """Core node views plus what the apply step needs to map a placement back to rows."""

    __slots__ = ("gpu_ids", "node_ids", "nodes")

    def __init__(self, nodes, node_ids, gpu_ids):
        self.nodes: list[core.NodeView] = nodes
        self.node_ids: dict[str, int] = node_ids  # node name → id
        self.gpu_ids: dict[tuple[int, int], int] = gpu_ids  # (node id, gpu index) → gpu id

    def node(self, name: str) -> core.NodeView:
        return next(n for n in self.nodes if n.name == name)


def mig_slices_from_mask(mask: int) -> tuple[core.MigSlice, ...]:
    # A slot per bit: `occupied_slices` counts an unknown profile as one slice.
    return tuple(core.MigSlice("", bit) for bit in range(8) if mask >> bit & 1)


def mig_mask(model: str, memory_mib: int, profile: str, start: int) -> int:
    size = profiles_for(model, memory_mib)[profile].slices
    return ((1 << size) - 1) << start


def _gpu_view(row: dict, *, empty: bool = False) -> core.GpuView:
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
            interconnect_group=row["interconnect_group"],
            numa_node=row["numa_node"] or 0,
            healthy=row["healthy"],
            driver_version=row["driver_version"],
            cuda_version=row["cuda_version"],
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
        tenants=(str(tenant),) if tenant is not None and not empty else (),
    )


def _lease_ends(leases) -> tuple[core.LeaseEnd, ...]:
    """Holding leases of a node (JSON rows of `_read`) as core lease ends, earliest first."""
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
_PRICE_MAX = 1e6
_ENERGY_LETTERS = "ABCDEFG"


def label_price(labels: dict) -> float:
    """The node's price per hour from its label; 0.0 when absent or not a finite number ≥ 0."""
    try:
        price = float(str(labels.get(PRICE_LABEL, "0")).strip())
    except (TypeError, ValueError):
        return 0.0
    return price if math.isfinite(price) and 0 <= price <= _PRICE_MAX else 0.0


def label_energy_class(labels: dict) -> int:
    """The node's energy class from its label: 0…9, or A…G as 0…6; 0 when it does not parse."""
    raw = str(labels.get(ENERGY_LABEL, "")).strip()
    if len(raw) == 1 and raw.upper() in _ENERGY_LETTERS:
        return _ENERGY_LETTERS.index(raw.upper())
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) <= 9 else 0


def _label_pairs(labels) -> frozenset[str]:
    if not isinstance(labels, dict):
        return frozenset()
    return frozenset(f"{k}={v}" for k, v in labels.items() if isinstance(v, str | int | float))


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


def _node_view(row: dict, gpus: list[dict], *, empty: bool = False) -> core.NodeView:
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
        gpus=tuple(_gpu_view(g, empty=empty) for g in gpus),
        state=NodeState.READY if empty else row["state"],
        reachable=empty or row["reachability"] == Reachability.REACHABLE,
        labels={str(k): str(v) for k, v in labels.items()},
        price_per_hour=label_price(labels),
        energy_class=label_energy_class(labels),
        workload_labels=frozenset().union(*(_label_pairs(w.get("labels")) for w in work)),
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
        # the image digests the node's agent reports in its cache (heartbeats)
        warm_images=frozenset(row["cached_images"] or ()),
        leases=() if empty else _lease_ends(row.get("leases")),
    )


def _read(
    pool_id: int,
    states: list[str],
    leases: bool = True,
    reachable_only: bool = False,
    work: bool = True,
) -> tuple[list[dict], dict[int, list[dict]]]:
    """Nodes with their GPUs and their holding leases' ends, in one query (both aggregated as
    JSON per node), no locks. Backfill leases hold nothing on the node ledger: not listed.
    `leases=False` leaves the lease ends out (an empty list per node): placement does not use
    them, only explanations do, and reading them costs O(live leases of the pool).
    `reachable_only`: without the nodes that missed their heartbeats. `work`: with the labels
    and NUMA pins of the node's holding leases (off for the empty view)."""
    if connection.vendor != "postgresql":
        return _read_portable(pool_id, states, leases, reachable_only, work)
    node_cols = ", ".join(f'n."{f}"' for f in _NODE_FIELDS)
    gpu_cols = ", ".join(
        f"'{f}', g.\"{f}\"" for f in _GPU_FIELDS if f not in ("node_id", "share_tenant_id")
    )
    sql = (
        f"SELECT {node_cols}, CAST((SELECT COALESCE(json_agg(json_build_object({gpu_cols}, "
        f"'node_id', g.node_id, 'share_tenant_id', g.share_tenant_id) ORDER BY g.\"index\"), "
        f"'[]'::json) FROM {GpuDevice._meta.db_table} g WHERE g.node_id = n.id) AS text), "
        # the work on the node that placement reads: its jobs' labels (anti-affinity) and what
        # leases pinned to a NUMA node hold there; only leases that carry either
        + (
            "CAST((SELECT COALESCE(json_agg(json_build_object('labels', l.request->'labels', "
            "'numa', l.placement->'numa_node', 'cpu', l.cpu_millicores, "
            "'mem', l.memory_mib, 'backfill', l.backfill_of_id IS NOT NULL) ORDER BY l.id), "
            "'[]'::json) "
            f"FROM {Lease._meta.db_table} l WHERE l.node_id = n.id AND l.state = ANY(%s) "
            "AND (l.request ? 'labels' OR jsonb_typeof(l.placement->'numa_node') = 'number')) "
            "AS text), "
            if work
            else "'[]', "
        )
        + (
            "CAST((SELECT COALESCE(json_agg(json_build_object('id', l.id, 'tenant', l.tenant_id, "
            "'ends_at', l.expires_at, "
            "'cpu_millicores', l.cpu_millicores, 'memory_mib', l.memory_mib, "
            "'scratch_mib', l.scratch_mib, 'gpu_allocations', l.gpu_allocations) "
            "ORDER BY l.expires_at, l.id), '[]'::json) "
            f"FROM {Lease._meta.db_table} l WHERE l.node_id = n.id AND l.state = ANY(%s) "
            "AND l.backfill_of_id IS NULL AND l.expires_at IS NOT NULL) AS text) "
            if leases
            else "'[]' "
        )
        + f"FROM {Node._meta.db_table} n WHERE n.pool_id = %s AND n.state = ANY(%s) "
        + ("AND n.reachability = %s " if reachable_only else "")
        + "ORDER BY n.name"
    )
    params = [*([sorted(HOLDING)] if work else []), *([sorted(HOLDING)] if leases else [])]
    params += [pool_id, states]
    params += [Reachability.REACHABLE.value] if reachable_only else []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        raw = cursor.fetchall()
    rows, gpus_by_node = [], {}
    for record in raw:  # JSON comes as text, for orjson: 3x faster than psycopg's json.loads
        row = dict(zip(_NODE_FIELDS, record[:-3], strict=True))
        for key in ("labels", "runtimes", "cached_images", "numa_layout"):
            if isinstance(row[key], str):
                row[key] = orjson.loads(row[key])
        gpus, row["work"], row["leases"] = (orjson.loads(text) for text in record[-3:])
        gpus_by_node[row["id"]] = gpus
        rows.append(row)
    return rows, gpus_by_node


def _read_portable(
    pool_id: int, states: list[str], leases: bool, reachable_only: bool = False, work: bool = True
) -> tuple[list[dict], dict[int, list[dict]]]:
    """The same rows through the ORM, in three queries: for SQLite (`make run`'s default)."""
    nodes = Node.objects.filter(pool_id=pool_id, state__in=states)
    if reachable_only:
        nodes = nodes.filter(reachability=Reachability.REACHABLE)
    rows = list(nodes.order_by("name").values(*_NODE_FIELDS))
    ids = [row["id"] for row in rows]
    gpus_by_node: dict[int, list[dict]] = {node_id: [] for node_id in ids}
    for gpu in GpuDevice.objects.filter(node_id__in=ids).order_by("index").values(*_GPU_FIELDS):
        gpus_by_node[gpu["node_id"]].append(gpu)
    ends: dict[int, list[dict]] = {node_id: [] for node_id in ids}
    if leases:
        held = Lease.objects.filter(
            node_id__in=ids, state__in=HOLDING, backfill_of__isnull=True, expires_at__isnull=False
        ).order_by("expires_at", "id")
        for lease in held.values(
            "id",
            "tenant",
            "node_id",
            "expires_at",
            "cpu_millicores",
            "memory_mib",
            "scratch_mib",
            "gpu_allocations",
        ):
            ends[lease.pop("node_id")].append(lease | {"ends_at": lease.pop("expires_at")})
    on_node: dict[int, list[dict]] = {node_id: [] for node_id in ids}
    if work:
        holding = Lease.objects.filter(node_id__in=ids, state__in=HOLDING).order_by("id")
        for lease in holding.values(
            "node_id", "request", "placement", "cpu_millicores", "memory_mib", "backfill_of_id"
        ):
            request = lease["request"] if isinstance(lease["request"], dict) else {}
            placement = lease["placement"] if isinstance(lease["placement"], dict) else {}
            numa = placement.get("numa_node")
            if "labels" not in request and not (isinstance(numa, int) and numa is not True):
                continue  # as the query: only leases with labels or a NUMA pin
            on_node[lease["node_id"]].append(
                {
                    "labels": request.get("labels"),
                    "numa": numa,
                    "cpu": lease["cpu_millicores"],
                    "mem": lease["memory_mib"],
                    "backfill": lease["backfill_of_id"] is not None,
                }
            )
    for row in rows:
        row["leases"] = ends[row["id"]]
        row["work"] = on_node[row["id"]]
    return rows, gpus_by_node


# Scorers that read the labels of the work already on a node (not in the product's default).
_WORK_SCORERS = frozenset({"paper_gpu_clustering"})


def needs_work(req: core.Request, policy: core.Policy) -> bool:
    """Whether placing `req` reads the work on the nodes (its labels, NUMA pins): only for
    anti-affinity, a NUMA requirement, or a scorer of workload labels. Reading it costs a scan
    of each node's holding leases, so the reserve hot path skips it otherwise."""
    return bool(
        req.anti_affinity
        or req.require_numa
        or _WORK_SCORERS.intersection(name for name, w in policy.weights.items() if w)
    )


def pool_snapshot(
    pool_id: int,
    *,
    states=SCHEDULABLE,
    empty: bool = False,
    leases: bool = True,
    reachable_only: bool = True,
    work: bool = True,
) -> Snapshot:
    """Nodes of the pool in `states` as core views: two queries, no locks.

    Unreachable nodes (missed heartbeats) are left out unless `reachable_only=False`, where
    they are viewed as such and the core counts them as `node_unreachable` (explanations).
    `empty=True` views every node as ready, reachable and empty (allocatable only): what the
    pool could ever offer, used to tell "never fits" (422) from "not now" (409); a node may come
    back. `leases=False`: without the nodes' lease ends (see `_read`; the reserve hot path).
    """
    rows, gpus_by_node = _read(
        pool_id,
        list(states),
        leases=leases and not empty,
        reachable_only=reachable_only and not empty,
        work=work and not empty,
    )
    nodes, node_ids, gpu_ids = [], {}, {}
    for row in rows:
        gpus = gpus_by_node.get(row["id"], [])
        nodes.append(_node_view(row, gpus, empty=empty))
        node_ids[row["name"]] = row["id"]
        for g in gpus:
            gpu_ids[(row["id"], g["index"])] = g["id"]
    return Snapshot(nodes, node_ids, gpu_ids)


def all_nodes_snapshot(pool_id: int) -> Snapshot:
    """Every node of the pool that is not retired, as it is now (for explanations)."""
    states = [s for s in NodeState.values if s != NodeState.RETIRED]
    return pool_snapshot(pool_id, states=states, reachable_only=False)


def image_archs(platforms) -> tuple[str, ...]:
    """The architectures of an image's platforms ("linux/arm64/v8" → "arm64")."""
    archs = {p.split("/")[1] for p in platforms or () if isinstance(p, str) and p.count("/") >= 1}
    return tuple(sorted(archs))


def core_request(request: dict, tenant_id: int | str = "", image_platforms=()) -> core.Request:
    """A validated shape/request dict (pools.api.serializers.REQUEST_FIELDS) as a core Request.
    `image_platforms` (a job's, ["linux/amd64"]) feed the core's image_arch filter."""
    sharing = request.get("gpu_sharing_class") or GpuSharingClass.NONE
    gpu_count = int(request.get("gpu_count") or 0)
    if sharing == GpuSharingClass.NONE:
        sharing, gpu_count = core.EXCLUSIVE, 0
    gpu_milli = 1000
    if sharing in (core.TIMESLICE, core.MPS) and request.get("gpu_milli"):
        gpu_milli = int(request["gpu_milli"])
    return core.Request(
        cpu_millicores=int(request.get("cpu_millicores_min") or 0),
        preferred_cpu_millicores=request.get("cpu_millicores_preferred"),
        memory_mib=int(request.get("memory_mib_min") or 0),
        preferred_memory_mib=request.get("memory_mib_preferred"),
        # a job's disk on its node: its scratch and its /outputs filesystem (output_limit_mib,
        # put in its request by jobs.services.job_submit)
        scratch_mib=int(request.get("scratch_mib") or 0)
        + int(request.get("output_limit_mib") or 0),
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_memory_mib=int(request.get("gpu_memory_mib_min") or 0),
        gpu_models=tuple(request.get("gpu_models") or ()),
        sharing=sharing,
        mig_profile=request.get("mig_profile") or "",
        arch=request.get("architecture") or "",
        os=request.get("os") or "",
        runtime=request.get("container_runtime") or "",
        regions=tuple(request.get("regions") or ()),
        zones=tuple(request.get("zones") or ()),
        network_class=request.get("network_class") or "",
        node_pin=request.get("node_pin") or "",
        tenant=str(tenant_id),
        image_archs=image_archs(image_platforms),
        # a job's placement fields (jobs.services.job_submit puts them in its request)
        affinity=_label_dict(request.get("affinity")),
        anti_affinity=tuple(sorted(_label_pairs(request.get("anti_affinity")))),
        labels=tuple(sorted(_label_pairs(request.get("labels")))),
        require_numa=request.get("require_numa") is True,
    )


def _label_dict(labels) -> dict[str, str]:
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items() if isinstance(v, str | int | float)}


def reservation_view(parent) -> core.NodeView | None:
    """What a reservation holds, minus its live backfills, as one node for the core.

    Backfill runs inside the reservation's hold, so it is placed against this view; MIG slices
    held by a reservation are not offered to backfill.
    """
    row = Node.objects.filter(pk=parent.node_id).values(*_NODE_FIELDS).first()
    if row is None:
        return None
    children = list(
        parent.backfills.filter(state__in=HOLDING).values(
            "tenant_id", "cpu_millicores", "memory_mib", "scratch_mib", "gpu_allocations"
        )
    )
    used_milli: dict[int, int] = {}
    tenants: dict[int, set[str]] = {}
    for child in children:
        for alloc in child["gpu_allocations"]:
            used_milli[alloc["gpu"]] = used_milli.get(alloc["gpu"], 0) + alloc["milli"]
            if alloc["milli"] < 1000:
                tenants.setdefault(alloc["gpu"], set()).add(str(child["tenant_id"]))
    held = [a for a in parent.gpu_allocations if not a.get("mig_slots")]
    gpu_rows = {
        g["id"]: g
        for g in GpuDevice.objects.filter(pk__in=[a["gpu"] for a in held]).values(*_GPU_FIELDS)
    }
    gpus = []
    for alloc in held:
        g = gpu_rows.get(alloc["gpu"])
        if g is None:
            continue
        base = _gpu_view(g, empty=True)
        gpus.append(
            replace(
                base,
                free_milli=max(0, alloc["milli"] - used_milli.get(alloc["gpu"], 0)),
                tenants=tuple(sorted(tenants.get(alloc["gpu"], ()))),
            )
        )
    node = _node_view(row, [], empty=True)
    return replace(
        node,
        cpu_millicores=parent.cpu_millicores,
        memory_mib=parent.memory_mib,
        scratch_mib=parent.scratch_mib,
        free_cpu_millicores=parent.cpu_millicores - sum(c["cpu_millicores"] for c in children),
        free_memory_mib=parent.memory_mib - sum(c["memory_mib"] for c in children),
        free_scratch_mib=parent.scratch_mib - sum(c["scratch_mib"] for c in children),
        gpus=tuple(gpus),
        state=row["state"],
        reachable=row["reachability"] == Reachability.REACHABLE,  # no backfill onto a lost node
    )
