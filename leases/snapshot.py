"""The thin adapter between the database and the pure scheduler core.

`pool_snapshot` reads the schedulable (ready and reachable) nodes of a pool and their GPUs in one
query, with no locks (`snapshot_rows`), and turns them into core `NodeView`s whose free capacity
is allocatable − reserved (`node_views`); asked, it views the draining nodes that drain-exempt
requests (a volume's export) are pinned to as well. The snapshot may be stale by the time it is
used; the ledger's write (`leases.services.ledger`) guards every capacity change with a
compare-and-set UPDATE, so staleness costs a retry, never an overcommit.

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

from dataclasses import replace

from leases.choices import HOLDING
from leases.node_views import gpu_view, label_pairs, node_view
from leases.snapshot_rows import GPU_FIELDS, NODE_FIELDS, read, zone_work_labels
from nodes.choices import SCHEDULABLE, NodeState, Reachability
from nodes.models import GpuDevice, Node
from placement import types as core
from placement.plugins import data_locality
from pools.choices import GpuSharingClass
from pools.knobs import pool_policy as pool_policy  # the core's policy of a pool, re-exported
from worker_agent.input_cache import key_for


class Snapshot:
    """Core node views plus what the apply step needs to map a placement back to rows."""

    __slots__ = ("gpu_ids", "node_ids", "nodes")

    def __init__(self, nodes, node_ids, gpu_ids):
        self.nodes: list[core.NodeView] = nodes
        self.node_ids: dict[str, int] = node_ids  # node name → id
        self.gpu_ids: dict[tuple[int, int], int] = gpu_ids  # (node id, gpu index) → gpu id

    def node(self, name: str) -> core.NodeView:
        return next(n for n in self.nodes if n.name == name)


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


def needs_zone_work(req: core.Request) -> bool:
    """Whether placing `req` reads the work of whole zones: anti-affinity scoped to zones,
    which counts the work on every node of a node's zone (schedulable or not)."""
    return req.zone_scoped


def registered_empty(pool_id: int) -> Snapshot:
    """Every node of the pool that is not retired, viewed ready and empty: what "never fits"
    is measured against (reserve's 422), and whether a waiting job fits some node at all."""
    states = [state for state in NodeState.values if state != NodeState.RETIRED]
    return pool_snapshot(pool_id, states=states, empty=True)


def pool_snapshot(
    pool_id: int,
    *,
    states=SCHEDULABLE,
    empty: bool = False,
    leases: bool = True,
    reachable_only: bool = True,
    work: bool = True,
    zone_work: bool | None = None,
    data_keys=(),
    draining=(),
) -> Snapshot:
    """Nodes of the pool in `states` as core views: one query (PostgreSQL), no locks.

    Unreachable nodes (missed heartbeats) are left out unless `reachable_only=False`, where
    they are viewed as such and the core counts them as `node_unreachable` (explanations).
    `empty=True` views every node as ready, reachable and empty (allocatable only): what the
    pool could ever offer, used to tell "never fits" (422) from "not now" (409); a node may come
    back. `leases=False`: without the nodes' lease ends (see `snapshot_rows.read`; the
    reserve hot path). `zone_work` (default: as `work`): each node's `zone_workload_labels`,
    the labels of the work on every node of its zone in the pool, those the snapshot leaves
    out (draining, unreachable) included: what zone-scoped anti-affinity reads. `data_keys`
    (`data_keys_of` the requests at hand): each node's `cached_data` holds what its caches
    have of those only (data locality); none: nothing of its caches is read. `draining`
    (`draining_pins` of the requests at hand): names of nodes viewed too while they are
    draining, for the drain-exempt requests pinned to them (a volume's export); none: a
    draining node is not read, and a pass without such a request costs nothing more.
    """
    rows, gpus_by_node = read(
        pool_id,
        list(states),
        leases=leases and not empty,
        reachable_only=reachable_only and not empty,
        work=work and not empty,
        data_keys=() if empty else data_keys,
        draining=() if empty else draining,
    )
    zones = {}
    if (work if zone_work is None else zone_work) and not empty:
        zones = zone_work_labels(pool_id)
    nodes, node_ids, gpu_ids = [], {}, {}
    for row in rows:
        gpus = gpus_by_node.get(row["id"], [])
        zone_labels = zones.get(row["zone"], frozenset()) if row["zone"] else frozenset()
        nodes.append(node_view(row, gpus, empty=empty, zone_labels=zone_labels))
        node_ids[row["name"]] = row["id"]
        for g in gpus:
            gpu_ids[(row["id"], g["index"])] = g["id"]
    return Snapshot(nodes, node_ids, gpu_ids)


def all_nodes_snapshot(pool_id: int) -> Snapshot:
    """Every node of the pool that is not retired, as it is now (for explanations)."""
    states = [s for s in NodeState.values if s != NodeState.RETIRED]
    return pool_snapshot(pool_id, states=states, reachable_only=False)


def draining_pins(requests) -> frozenset[str]:
    """The nodes the drain-exempt requests among `requests` (core Requests) are pinned to: the
    draining nodes a snapshot for them must view too (`pool_snapshot(draining=…)`). Only the
    control plane makes such a request, the export of a volume (jobs/volume_export.py), and it
    is always pinned to the volume's node; an unpinned one would see no draining node."""
    return frozenset(req.node_pin for req in requests if req.drain_exempt and req.node_pin)


def data_keys_of(requests) -> frozenset[str]:
    """The image digests and input keys `requests` (core Requests) need on their node."""
    return frozenset(key for req in requests for key in data_locality.data_keys(req))


def input_keys(inputs) -> tuple[str, ...]:
    """A job's `inputs` ([{"url", "name"}]) as the node input cache keys them
    (worker_agent.input_cache.key_for): plain http(s) URLs; s3:// inputs are presigned per lease
    on their bucket's endpoint, which the snapshot does not read: not keyed (yet)."""
    keys = []
    for item in inputs or ():
        url = item.get("url") if isinstance(item, dict) else item
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            keys.append(
                key_for(url, presigned=isinstance(item, dict) and item.get("presigned") is True)
            )
    return tuple(dict.fromkeys(keys))


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
        preferred_gpu_count=(request.get("gpu_count_preferred") or None) if gpu_count else None,
        gpu_milli=gpu_milli,
        gpu_memory_mib=int(request.get("gpu_memory_mib_min") or 0),
        preferred_gpu_memory_mib=(request.get("gpu_memory_mib_preferred") or None)
        if gpu_count
        else None,
        min_driver_version=request.get("gpu_driver_version_min") or "",
        min_cuda_version=request.get("gpu_cuda_version_min") or "",
        min_compute_capability=request.get("gpu_compute_capability_min") or "",
        require_interconnect=request.get("gpu_interconnect_required") is True,
        gpu_models=tuple(request.get("gpu_models") or ()),
        sharing=sharing,
        mig_profile=request.get("mig_profile") or "",
        arch=request.get("architecture") or "",
        os=request.get("os") or "",
        runtime=request.get("container_runtime") or "",
        regions=tuple(request.get("regions") or ()),
        zones=tuple(request.get("zones") or ()),
        preferred_regions=tuple(request.get("regions_preferred") or ()),
        preferred_zones=tuple(request.get("zones_preferred") or ()),
        require_warm_image=request.get("warm_image_required") is True,
        min_trust_level=int(request.get("trust_level_min") or 0),
        network_class=request.get("network_class") or "",
        node_features=tuple(sorted(request.get("node_features_required") or ())),
        node_pin=request.get("node_pin") or "",
        # put in a job's request by the control plane alone (jobs/volume_export.py); the
        # submit and lease serializers refuse the key from anyone else
        drain_exempt=request.get("drain_exempt") is True,
        tenant=str(tenant_id),
        image_archs=image_archs(image_platforms),
        # a job's placement fields (jobs.services.job_submit puts them in its request)
        affinity=_label_dict(request.get("affinity")),
        preferred_affinity=_label_dict(request.get("affinity_preferred")),
        anti_affinity=tuple(sorted(label_pairs(request.get("anti_affinity")))),
        anti_affinity_scope=request.get("anti_affinity_scope") or core.HOST_SCOPE,
        labels=tuple(sorted(label_pairs(request.get("labels")))),
        require_numa=request.get("require_numa") is True,
    )


def _label_dict(labels) -> dict[str, str]:
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items() if isinstance(v, str | int | float)}


def reservation_view(parent, *, whole: bool = False) -> core.NodeView | None:
    """What a reservation holds, minus its live backfills (`whole`: as if none ran, what a job
    named into it will have once its window opens), as one node for the core.

    Backfill runs inside the reservation's hold, so it is placed against this view; MIG slices
    held by a reservation are not offered to backfill.
    """
    row = Node.objects.filter(pk=parent.node_id).values(*NODE_FIELDS).first()
    if row is None:
        return None
    children = (
        []
        if whole
        else list(
            parent.backfills.filter(state__in=HOLDING).values(
                "tenant_id", "cpu_millicores", "memory_mib", "scratch_mib", "gpu_allocations"
            )
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
        for g in GpuDevice.objects.filter(pk__in=[a["gpu"] for a in held]).values(*GPU_FIELDS)
    }
    gpus = []
    for alloc in held:
        g = gpu_rows.get(alloc["gpu"])
        if g is None:
            continue
        base = gpu_view(g, empty=True)
        gpus.append(
            replace(
                base,
                free_milli=max(0, alloc["milli"] - used_milli.get(alloc["gpu"], 0)),
                tenants=tuple(sorted(tenants.get(alloc["gpu"], ()))),
            )
        )
    node = node_view(row, [], empty=True)
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
