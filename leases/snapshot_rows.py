"""The snapshot's read: a pool's nodes with their GPUs and the holding leases on them, as
plain rows (`leases.node_views` makes them core views). No locks.

On PostgreSQL one query aggregates each node's GPUs and leases as JSON; the portable path
(SQLite, `make run`; `leases.backend`) reads the same rows through the ORM in a few queries.
"""

from __future__ import annotations

import orjson
from django.db import connection
from django.db.models import Q

from leases import backend
from leases.choices import HOLDING
from leases.models import Lease
from leases.node_views import label_pairs
from nodes.choices import NodeState, Reachability
from nodes.models import GpuDevice, Node

NODE_FIELDS = (
    "id",
    "name",
    "state",
    "reachability",
    "architecture",
    "os",
    "runtimes",
    "features",
    "cached_images",
    "labels",
    "region",
    "zone",
    "rack",
    "network_class",
    "price_class",
    "energy_class",
    "trust_level",
    "numa_layout",
    "cpu_millicores_allocatable",
    "memory_mib_allocatable",
    "scratch_mib_allocatable",
    "cpu_millicores_reserved",
    "memory_mib_reserved",
    "scratch_mib_reserved",
    "pull_bytes_per_s",
    "download_bytes_per_s",
)
GPU_FIELDS = (
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
    "compute_capability",
    "milli_reserved",
    "mig_slots_used",
    "mig_slices",  # the instances the agent reported (placement/mig.py layout_starts)
    "share_tenant_id",
)


def read(
    pool_id: int,
    states: list[str],
    *,
    leases: bool,
    reachable_only: bool,
    work: bool,
    data_keys=(),
    draining=(),
) -> tuple[list[dict], dict[int, list[dict]]]:
    """Nodes of the pool in `states` (ordered by name) and their GPUs (by index), each node
    with `leases` (its holding leases' ends) and `work` (what placement reads of the work on
    it). Backfill leases hold nothing on the node ledger: not listed.
    `leases=False` leaves the lease ends out (an empty list per node): placement does not use
    them, only explanations do, and reading them costs O(live leases of the pool).
    `reachable_only`: without the nodes that missed their heartbeats. `work`: with the labels
    and NUMA pins of the node's holding leases (off for the empty view). `data_keys`: the
    image digests and input keys the requests at hand need; each node's `data` is what its
    caches hold of those alone, {key: bytes} (data locality: never the whole cache).
    `draining`: names of nodes read too while they are draining, whatever `states` says (the
    nodes drain-exempt requests are pinned to: `leases.snapshot.draining_pins`)."""
    data_keys, draining = sorted(set(data_keys)), sorted(set(draining))
    if not backend.postgresql():
        return _read_orm(pool_id, states, leases, reachable_only, work, data_keys, draining)
    sql = _SELECT.format(
        work=_WORK if work else "'[]'",
        ends=_ENDS if leases else "'[]'",
        data=_DATA if data_keys else "'{}'",
        states=_DRAINING_TOO if draining else "n.state = ANY(%(states)s)",
        reachable="AND n.reachability = %(reachable)s " if reachable_only else "",
    )
    params = {
        "holding": sorted(HOLDING),
        "pool": pool_id,
        "states": states,
        "reachable": Reachability.REACHABLE.value,
        "data_keys": data_keys,
    }
    if draining:
        params |= {"draining": draining, "draining_state": NodeState.DRAINING.value}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        raw = cursor.fetchall()
    rows, gpus_by_node = [], {}
    for record in raw:  # JSON comes as text, for orjson: 3x faster than psycopg's json.loads
        row = dict(zip(NODE_FIELDS, record[:-4], strict=True))
        for key in ("labels", "runtimes", "features", "cached_images", "numa_layout"):
            if isinstance(row[key], str):
                row[key] = orjson.loads(row[key])
        gpus, row["work"], row["leases"], row["data"] = (orjson.loads(text) for text in record[-4:])
        gpus_by_node[row["id"]] = gpus
        rows.append(row)
    return rows, gpus_by_node


# each GPU as row_to_json of its GPU_FIELDS columns: a fifth cheaper in PostgreSQL than
# json_build_object of the same keys and values (5,000 nodes, 13,764 GPUs: 95 ms against 120)
_GPU_COLUMNS = ", ".join(f'g."{f}"' for f in GPU_FIELDS)
# the work on a node that placement reads: its jobs' labels (anti-affinity) and what leases
# pinned to a NUMA node hold there; only leases that carry either
_WORK = (
    "CAST((SELECT COALESCE(json_agg(json_build_object('labels', l.request->'labels', "
    "'numa', l.placement->'numa_node', 'cpu', l.cpu_millicores, "
    "'mem', l.memory_mib, 'backfill', l.backfill_of_id IS NOT NULL) ORDER BY l.id), "
    f"'[]'::json) FROM {Lease._meta.db_table} l "
    "WHERE l.node_id = n.id AND l.state = ANY(%(holding)s) "
    "AND (l.request ? 'labels' OR jsonb_typeof(l.placement->'numa_node') = 'number')) AS text)"
)
# the holding leases' ends, earliest first
_ENDS = (
    "CAST((SELECT COALESCE(json_agg(json_build_object('id', l.id, 'tenant', l.tenant_id, "
    "'ends_at', l.expires_at, 'cpu_millicores', l.cpu_millicores, "
    "'memory_mib', l.memory_mib, 'scratch_mib', l.scratch_mib, "
    "'gpu_allocations', l.gpu_allocations) ORDER BY l.expires_at, l.id), '[]'::json) "
    f"FROM {Lease._meta.db_table} l WHERE l.node_id = n.id AND l.state = ANY(%(holding)s) "
    "AND l.backfill_of_id IS NULL AND l.expires_at IS NOT NULL) AS text)"
)
# what the node's caches hold of the data the requests at hand need: {key: bytes}
# (the key-existence test first: most nodes hold none of them, and it reads no entry)
_DATA = (
    "CASE WHEN n.cached_data ?| CAST(%(data_keys)s AS text[]) THEN "
    "CAST((SELECT jsonb_object_agg(d.key, d.value) "
    "FROM jsonb_each(n.cached_data) d WHERE d.key = ANY(%(data_keys)s)) AS text) ELSE '{}' END"
)
# the nodes in `states`, and the draining ones named (pinned by drain-exempt requests)
_DRAINING_TOO = (
    "(n.state = ANY(%(states)s) OR (n.state = %(draining_state)s "
    "AND n.name = ANY(CAST(%(draining)s AS text[]))))"
)
# {work}, {ends}, {data}, {states}, {reachable}: the fragments above, or stand-ins for what is
# not read
_SELECT = (
    "SELECT " + ", ".join(f'n."{f}"' for f in NODE_FIELDS) + ", "
    "CAST((SELECT COALESCE(json_agg(x ORDER BY x.\"index\"), '[]'::json) FROM (SELECT "
    f"{_GPU_COLUMNS} FROM {GpuDevice._meta.db_table} g WHERE g.node_id = n.id) x) AS text), "
    "{work}, {ends}, {data} "
    f"FROM {Node._meta.db_table} n WHERE n.pool_id = %(pool)s AND {{states}} "
    "{reachable}ORDER BY n.name"
)


def zone_work_labels(pool_id: int) -> dict[str, frozenset[str]]:
    """zone → the "key=value" labels of the holding leases' requests on every node of the pool
    in that zone, whatever its state or reachability (work on a draining node still runs
    there): what zone-scoped anti-affinity avoids. One query over the labelled leases."""
    zones: dict[str, set[str]] = {}
    labelled = (
        Lease.objects.filter(node__pool_id=pool_id, state__in=HOLDING, request__has_key="labels")
        .exclude(node__zone="")
        .order_by()
    )
    for zone, labels in labelled.values_list("node__zone", "request__labels"):
        zones.setdefault(zone, set()).update(label_pairs(labels))
    return {zone: frozenset(labels) for zone, labels in zones.items()}


def _read_orm(
    pool_id: int,
    states: list[str],
    leases: bool,
    reachable_only: bool,
    work: bool,
    data_keys=(),
    draining=(),
) -> tuple[list[dict], dict[int, list[dict]]]:
    """The same rows through the ORM, in three queries: for SQLite (`make run`'s default)."""
    chosen = Q(state__in=states)
    if draining:
        chosen |= Q(state=NodeState.DRAINING, name__in=draining)
    nodes = Node.objects.filter(chosen, pool_id=pool_id)
    if reachable_only:
        nodes = nodes.filter(reachability=Reachability.REACHABLE)
    fields = (*NODE_FIELDS, "cached_data") if data_keys else NODE_FIELDS
    rows = list(nodes.order_by("name").values(*fields))
    wanted = set(data_keys)
    for row in rows:
        held = row.pop("cached_data", None)
        held = held if isinstance(held, dict) else {}
        row["data"] = {key: held[key] for key in wanted.intersection(held)}
    ids = [row["id"] for row in rows]
    gpus_by_node: dict[int, list[dict]] = {node_id: [] for node_id in ids}
    for gpu in GpuDevice.objects.filter(node_id__in=ids).order_by("index").values(*GPU_FIELDS):
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
