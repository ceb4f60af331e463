"""Snapshot and decision types of the scheduler core.

All are frozen, slotted dataclasses built from plain values, so a caller can construct them from
dicts or ORM rows (``NodeView.from_dict``) and the planner can treat them as immutable snapshots.
Units: CPU in millicores, memory and disk in MiB, GPU capacity in milli-GPU (1000 = one device).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

# GPU sharing classes. A device is configured for exactly one mode and only serves that class.
EXCLUSIVE = "exclusive"  # whole devices, one workload each
MIG = "mig"  # hardware-isolated MIG slices (memory and compute)
TIMESLICE = "timeslice"  # non-isolated time sharing
MPS = "mps"  # non-isolated CUDA MPS sharing
SHARING_CLASSES = (EXCLUSIVE, MIG, TIMESLICE, MPS)
NON_ISOLATED = frozenset({TIMESLICE, MPS})

SCHEDULABLE_STATES = frozenset({"ready"})
# What a drain-exempt request (``Request.drain_exempt``: a volume's export) may be placed on:
# a ready node, or one being drained (never a quarantined, retired or unreachable one).
DRAIN_EXEMPT_STATES = SCHEDULABLE_STATES | {"draining"}

# Where a request's anti-affinity looks for work with the labels it avoids: the node itself, or
# every node of the node's zone (a node without a zone: the node itself).
HOST_SCOPE = "host"
ZONE_SCOPE = "zone"
ANTI_AFFINITY_SCOPES = (HOST_SCOPE, ZONE_SCOPE)


def schedulable(node) -> bool:
    """Whether the node takes new work now: ready, healthy and reachable (what the
    `node_schedulable` filter checks)."""
    return node.state in SCHEDULABLE_STATES and node.healthy and node.reachable


# Gang topologies.
GANG_NONE = "none"
COLOCATE_ZONE = "colocate_zone"
COLOCATE_RACK = "colocate_rack"
COLOCATE_INTERCONNECT = "colocate_interconnect"  # all replicas on one host's NVLink domain
SPREAD_HOSTS = "spread_hosts"
SPREAD_ZONES = "spread_zones"
GANG_TOPOLOGIES = (
    GANG_NONE,
    COLOCATE_ZONE,
    COLOCATE_RACK,
    COLOCATE_INTERCONNECT,
    SPREAD_HOSTS,
    SPREAD_ZONES,
)


def _from_mapping(cls, data: Mapping[str, Any]):
    """Build ``cls`` from a mapping, ignoring unknown keys and turning lists into tuples."""
    names = {f.name for f in fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, set):
            value = frozenset(value)
        kwargs[key] = value
    return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class MigSlice:
    """A MIG instance already carved on a device: profile and memory-slice start position."""

    profile: str
    start: int
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU device as the scheduler sees it."""

    index: int
    model: str = ""
    memory_mib: int = 0
    free_milli: int = 1000
    sharing: str = EXCLUSIVE
    uuid: str = ""
    mig_slices: tuple[MigSlice, ...] = ()  # MIG instances in use (sharing == "mig")
    # the MIG instances carved on the device, as its agent reads them through NVML (profile and
    # start each); None: not reported, and any valid start is assumed carvable (placement/mig.py)
    mig_layout: tuple[MigSlice, ...] | None = None
    interconnect_group: str = ""  # NVLink/NVSwitch domain; "" means none
    numa_node: int = 0
    healthy: bool = True
    health_flags: tuple[str, ...] = ()  # e.g. "xid_error", "over_temperature", "pcie_degraded"
    driver_version: str = ""
    cuda_version: str = ""
    compute_capability: str = ""  # "major.minor" as NVML reports it ("9.0"); "": not reported
    tenants: tuple[str, ...] = ()  # tenants holding shares of this device (timeslice/mps)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuView:
        data = dict(data)
        for key in ("mig_slices", "mig_layout"):
            if data.get(key) is not None:
                data[key] = tuple(
                    s if isinstance(s, MigSlice) else MigSlice(**s) for s in data[key]
                )
        return _from_mapping(cls, data)

    @property
    def is_free(self) -> bool:
        return self.free_milli >= 1000 and not self.mig_slices


@dataclass(frozen=True, slots=True)
class NumaView:
    """Free CPU and memory on one NUMA node of a host."""

    id: int
    free_cpu_millicores: int
    free_memory_mib: int


@dataclass(frozen=True, slots=True)
class LeaseEnd:
    """A lease holding capacity on a node, when it ends and what it frees then.

    ``gpu_milli`` is ``((device index, milli-GPU), ...)`` of whole or shared devices;
    ``mig_slots`` is ``((device index, memory-slice bitmask), ...)`` of the MIG slices it holds.
    ``ends_at`` is whatever the caller orders by (the adapter passes aware datetimes).
    """

    lease_id: str
    ends_at: Any
    # Its tenant: an explanation names only the requester's own leases (another tenant's are
    # "capacity frees up at ..."). "" = not known, as in the pure tests and replays.
    tenant: str = ""
    cpu_millicores: int = 0
    memory_mib: int = 0
    scratch_mib: int = 0
    gpu_milli: tuple[tuple[int, int], ...] = ()
    mig_slots: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeaseEnd:
        data = dict(data)
        data["lease_id"] = str(data.get("lease_id", ""))
        for key in ("gpu_milli", "mig_slots"):
            data[key] = tuple(tuple(pair) for pair in data.get(key, ()))
        return _from_mapping(cls, data)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node of the snapshot: allocatable and free capacity plus everything filters read."""

    name: str
    cpu_millicores: int = 0
    memory_mib: int = 0
    scratch_mib: int = 0
    free_cpu_millicores: int | None = None  # None: equal to allocatable (an empty node)
    free_memory_mib: int | None = None
    free_scratch_mib: int | None = None
    gpus: tuple[GpuView, ...] = ()
    state: str = "ready"
    healthy: bool = True
    reachable: bool = True  # heartbeats arrive; an unreachable node gets no new work
    labels: Mapping[str, str] = field(default_factory=dict)
    arch: str = "amd64"
    os: str = "linux"
    runtimes: frozenset[str] = frozenset({"docker"})
    region: str = ""
    zone: str = ""
    rack: str = ""
    network_class: str = ""
    features: frozenset[str] = frozenset()  # what its agent says it has ("avx512", "sgx")
    price_per_hour: float = 0.0
    energy_class: int = 0  # 0 = most efficient
    warm_images: frozenset[str] = frozenset()
    # Data locality (plugins/data_locality.py): (key, bytes) of what the node's caches hold of
    # the data the requests at hand need ("sha256:…" an image, else an input's cache key), and
    # the throughput it measured pulling images and downloading inputs (bytes/s; 0: unknown)
    cached_data: frozenset[tuple[str, int]] = frozenset()
    pull_bytes_per_s: float = 0.0
    download_bytes_per_s: float = 0.0
    trust_level: int = 0
    tenants: frozenset[str] = frozenset()  # tenants with work on the node
    workload_labels: frozenset[str] = frozenset()  # "key=value" labels of work on the node
    # "key=value" labels of the work on the nodes of its zone, as the adapter read them (nodes
    # outside the snapshot included); the planner adds what the nodes it is given run
    # (``bookkeeping.with_zone_work``) for a request whose anti-affinity is zone-scoped
    zone_workload_labels: frozenset[str] = frozenset()
    numa: tuple[NumaView, ...] = ()
    leases: tuple[LeaseEnd, ...] = ()  # holding leases with an end time, for explanations

    def __post_init__(self):
        # Default free capacity to allocatable, so an empty node needs only its size.
        for total, free in (
            ("cpu_millicores", "free_cpu_millicores"),
            ("memory_mib", "free_memory_mib"),
            ("scratch_mib", "free_scratch_mib"),
        ):
            if getattr(self, free) is None:
                object.__setattr__(self, free, getattr(self, total))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeView:
        data = dict(data)
        data["gpus"] = tuple(
            g if isinstance(g, GpuView) else GpuView.from_dict(g) for g in data.get("gpus", ())
        )
        data["numa"] = tuple(
            n if isinstance(n, NumaView) else NumaView(**n) for n in data.get("numa", ())
        )
        data["leases"] = tuple(
            x if isinstance(x, LeaseEnd) else LeaseEnd.from_dict(x) for x in data.get("leases", ())
        )
        if "cached_data" in data:  # {key: bytes} or (key, bytes) pairs
            held = data["cached_data"]
            pairs = held.items() if isinstance(held, Mapping) else held
            data["cached_data"] = frozenset((str(k), int(b)) for k, b in pairs)
        for key in (
            "runtimes",
            "features",
            "warm_images",
            "tenants",
            "workload_labels",
            "zone_workload_labels",
        ):
            if key in data:
                data[key] = frozenset(data[key])
        return _from_mapping(cls, data)

    @property
    def gpu_model(self) -> str:
        return self.gpus[0].model if self.gpus else ""

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Each device's model: what a device is, which placing work never changes."""
        return tuple(g.model for g in self.gpus)

    @property
    def gpu_compute_capabilities(self) -> tuple[str, ...]:
        """Each device's compute capability ("" where not reported): what a device is."""
        return tuple(g.compute_capability for g in self.gpus)

    @property
    def free_gpu_milli(self) -> int:
        return sum(g.free_milli for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Request:
    """What one replica asks for. ``preferred_*`` of None means "same as the minimum"."""

    name: str = ""
    cpu_millicores: int = 0
    memory_mib: int = 0
    scratch_mib: int = 0
    preferred_cpu_millicores: int | None = None
    preferred_memory_mib: int | None = None
    preferred_scratch_mib: int | None = None
    gpu_count: int = 0
    preferred_gpu_count: int | None = None
    gpu_milli: int = 1000  # per device; < 1000 only for timeslice/mps shares
    gpu_memory_mib: int = 0  # minimum memory per device
    preferred_gpu_memory_mib: int | None = None
    gpu_models: tuple[str, ...] = ()  # empty: any model
    sharing: str = EXCLUSIVE
    mig_profile: str = ""  # e.g. "1g.10gb" when sharing == "mig"
    min_driver_version: str = ""
    min_cuda_version: str = ""
    min_compute_capability: str = ""  # "major.minor": devices of a lower (or unknown) one refused
    require_interconnect: bool = False  # multi-GPU: all devices in one NVLink group
    require_numa: bool = False  # CPU/memory from the GPUs' NUMA node
    arch: str = ""  # empty: any
    os: str = ""
    runtime: str = ""
    regions: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    preferred_regions: tuple[str, ...] = ()
    preferred_zones: tuple[str, ...] = ()
    network_class: str = ""
    node_features: tuple[str, ...] = ()  # node features all required ("avx512", "infiniband")
    node_pin: str = ""
    # placed on a draining node too (DRAIN_EXEMPT_STATES): set by the control plane alone, for
    # the export of a volume whose node is being drained; never from a tenant's request
    drain_exempt: bool = False
    affinity: Mapping[str, str] = field(default_factory=dict)  # required node labels
    preferred_affinity: Mapping[str, str] = field(default_factory=dict)
    anti_affinity: tuple[str, ...] = ()  # "key=value" workload labels to avoid
    anti_affinity_scope: str = HOST_SCOPE  # where to look for them: the node, or its zone
    labels: tuple[str, ...] = ()  # this workload's own "key=value" labels
    min_trust_level: int = 0
    image: str = ""  # image digest
    inputs: tuple[str, ...] = ()  # its inputs' cache keys (data_locality)
    image_archs: tuple[str, ...] = ()  # architectures the image is built for; empty: any
    require_warm_image: bool = False
    tenant: str = ""
    priority: int = 0
    replicas: int = 1
    gang: str = GANG_NONE

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        return _from_mapping(cls, data)

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_count > 0 or (self.sharing == MIG and bool(self.mig_profile))

    @property
    def zone_scoped(self) -> bool:
        """Whether its anti-affinity looks at the work of whole zones: one node's fit then
        depends on the work of other nodes (``bookkeeping.with_zone_work``)."""
        return self.anti_affinity_scope == ZONE_SCOPE and bool(self.anti_affinity)


# The default filter chain: names of registered filters (``placement.plugins``). The
# first that refuses a node names the rejection, so the order decides which reason a node that
# fails several checks is counted under. Static filters run before the others.
DEFAULT_FILTERS = (
    "node_pin",
    "node_schedulable",
    "trust_level",
    "arch",
    "image_arch",
    "os",
    "runtime",
    "region",
    "network_class",
    "node_features",
    "affinity",
    "gpu_model",
    "gpu_compute_capability",
    "anti_affinity",
    "warm_image",
    "capacity",
)


@dataclass(frozen=True, slots=True)
class Policy:
    """A versioned scheduling policy: the filters that run, scorer weights and sharing rules.

    ``filters`` names registered filters, in order; ``weights`` maps registered scorer names to
    weights (``placement.registry``; build a policy from edited values with
    ``placement.policy_from``, which refuses unknown names). The version is echoed in
    every placement and explanation so decisions can be audited. ``workload`` is the typical
    request mix fragmentation is measured against (None: a generic mix derived from common
    shapes). ``integer_scores`` truncates every scorer's value to an integer before weighting, as
    the Kubernetes framework does (the paper policies); ``truncated`` names the scorers truncated
    when ``integer_scores`` is off.
    """

    name: str = "default"
    version: int = 1
    weights: Mapping[str, float] = field(default_factory=lambda: {"fragmentation": 1.0})
    filters: tuple[str, ...] = DEFAULT_FILTERS
    gpu_choice: str = "fragmentation"  # fragmentation | best_fit | lowest_index | random
    allow_tenant_mixing: bool = False
    integer_scores: bool = False
    truncated: tuple[str, ...] = ()
    workload: Any = None  # placement.fragmentation.Workload
    seed: int = 0  # only for the random policy

    def with_workload(self, workload) -> Policy:
        return replace(self, workload=workload)


@dataclass(frozen=True, slots=True)
class Grant:
    """One dimension of a placement: what was asked (minimum, preferred) and what was granted."""

    minimum: int
    preferred: int
    granted: int

    @property
    def degraded(self) -> bool:
        return self.granted < self.preferred


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """Capacity reserved on one GPU: milli-GPU, or a MIG slice (profile at start position)."""

    index: int
    milli: int = 1000
    mig_profile: str = ""
    mig_start: int = -1
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision for one replica: where, which devices, what is reserved, and why."""

    node: str
    request: Request
    cpu_millicores: int
    memory_mib: int
    scratch_mib: int
    devices: tuple[DeviceShare, ...]
    grants: Mapping[str, Grant]
    score: float
    score_breakdown: Mapping[str, float]
    policy_version: int
    policy_name: str = ""
    numa_node: int | None = None  # the NUMA node CPU and memory come from (require_numa)
    # What the placement's data (image, inputs) costs on the node (plugins/data_locality.py):
    # bytes its caches already hold, bytes still to move, and the seconds those are estimated
    # to take to arrive (None: the request names no data)
    data_avoided_bytes: int = 0
    data_moved_bytes: int = 0
    data_arrival_s: float | None = None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(d.index for d in self.devices)


@dataclass(frozen=True, slots=True)
class NearMiss:
    """The node that came closest, and what it lacked (dimension -> missing amount)."""

    node: str
    reason: str
    lacking: Mapping[str, int]
    message: str
    # When capacity frees up: the earliest time some node could take the request once the
    # leases ending by then are gone (None when no lease end would make room). Exact only for
    # the requester (`fits_exact`) when every lease that must end is its own; otherwise it is
    # for the planner alone (the queue's gate), and what anyone is told is a coarse window.
    fits_at: Any = None
    fits_exact: bool = True
    fits_on: str = ""
    after_leases: tuple[str, ...] = ()  # the leases that must end first (last one at fits_at)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why nothing was placed: rejected node counts per reason, and the nearest miss."""

    total_nodes: int
    reasons: Mapping[str, int]  # reason label -> node count, e.g. "node_not_schedulable(draining)"
    nearest_miss: NearMiss | None
    policy_version: int
    message: str
    gang_reason: str = ""

    def __bool__(self) -> bool:  # so `if place(...):` reads naturally
        return False


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """All replicas of a gang, placed in one decision."""

    placements: tuple[Placement, ...]
    topology: str
    domain: str  # zone/rack/node shared by a colocated gang; "" for spread gangs
    policy_version: int
