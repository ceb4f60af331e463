"""A pool's policy knobs, each declared once: its name, default, check and meaning.

A knob is a field of `PoolKnobs` made with `knob(default, check, doc)`; `KNOBS` is the same
declarations as a table of `Knob(name, default, check, doc)`. Publishing a policy version checks
its knobs against the table (`policy_version`, used by the publish service, the API and the
admin); docs/scheduler.md "Policy knobs" is the table in prose, and tests/pools/test_knobs.py
fails when the two differ.

Read a pool's knobs with `knobs_for(pool)` and its core policy (the scorer weights of the same
version) with `pool_policy(pool)`, both from one per-process cache of each pool's current
version, its knobs and policies. A version never changes, so what is read again is only which
version is current (the same number keeps its entry): after CACHE_SECONDS (a publish in another
process), or as soon as this process's publish commits (`version_published`, called by the
publish service). A stored value that fails its check (a version written before the check existed)
gives the knob's default, logged; a pool without a version has every default.

The core (placement/) never reads a pool: where a knob configures the core, the core keeps the
default as its own (QueuePolicy's fields and QUEUE_KNOBS' checks, choose_victims'
`min_runtime_s`), so it runs and is tested without a database, and the knob here names that
default instead of writing it again; the caller hands the core the pool's value.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from placement import types as core
from placement.policy import DEFAULT_POLICY, policy_from, policy_problems
from placement.preemption import DEFAULT_MIN_RUNTIME_S
from placement.queue import QUEUE_KNOBS, QueuePolicy
from pools.choices import RUNTIME_STRENGTH, ContainerRuntime, DrainPolicy
from pools.models import SchedulingPolicyVersion
from pools.network_rules import egress_entry_problem
from worker_agent.addresses import ALWAYS_REFUSED, host_refusal

logger = logging.getLogger(__name__)
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")

RESERVATION_KNOB_MAX_S = 365 * 86400
AGENT_TIMEOUT_MAX_S = 86400  # the agent's timings and preemption's protection of fresh work
RETENTION_MAX_DAYS = 3650
# /outputs is a filesystem of this many MiB on the node (the job field, whose default is the
# knob; the knob's 0: the pool's jobs get no output limit, which only the process runtime runs
# and the Docker runtime refuses)
OUTPUT_LIMIT_MAX_MIB = 1024 * 1024
EGRESS_ALLOWED_MAX_ENTRIES = 256
CREDIT_RATE_KEYS = frozenset({"cpu_core_hour", "memory_gib_hour", "gpu_hour", "consumed_factor"})
# A pool's `required_runtime`: "" (none required), or the weakest runtime its jobs may run under.
REQUIRED_RUNTIMES = ("", ContainerRuntime.DOCKER, ContainerRuntime.GVISOR)


# --- checks: what a value must be, or None when it is valid -----------------------------------


def _whole(unit_name: str, unit: str, low: int, high: int, *, low_means: str = ""):
    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"an integer number of {unit_name}"
        if not low <= value <= high:
            return f"between {low}{low_means} and {high} {unit}"
        return None

    return check


def _one_of(values: Sequence[str], shown: str):
    def check(value) -> str | None:
        return None if value in values else shown

    return check


def _class_name(value) -> str | None:
    """ "" or a priority class's name (a slug); a name no class has leaves jobs without one."""
    if isinstance(value, str) and (value == "" or (len(value) <= 40 and _SLUG.fullmatch(value))):
        return None
    return 'a priority class name (a slug of at most 40 characters), or ""'


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _credit_rates(value) -> str | None:
    """{class name or "default": {rate name: a non-negative number}} (leases/services/credits)."""
    what = f'a map of priority class (or "default") to rates among {sorted(CREDIT_RATE_KEYS)}'
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        return what
    for rates in value.values():
        for key, rate in rates.items():
            number = isinstance(rate, int | float) and not isinstance(rate, bool)
            if key not in CREDIT_RATE_KEYS or not number or not 0 <= rate <= 1e9:
                return what + ", each a number from 0 to 1e9"
    return None


def _egress_allowed(value) -> str | None:
    """CIDRs and host names a tenant's egress_allow may name (jobs/networks.py); none inside an
    always-refused range (loopback, link-local, …), no name of the loopback."""
    what = f"a list of at most {EGRESS_ALLOWED_MAX_ENTRIES} CIDRs and host names"
    if not isinstance(value, list) or len(value) > EGRESS_ALLOWED_MAX_ENTRIES:
        return what
    for entry in value:
        if not isinstance(entry, str) or not entry:
            return what
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if egress_entry_problem(entry) is not None or ":" in entry or host_refusal(entry):
                return f"{what} ({entry[:60]!r} is neither)"
            continue
        for why, nets in ALWAYS_REFUSED.items():  # a wider range may hold them: still refused
            refused = [ipaddress.ip_network(net) for net in nets]
            if any(n.version == network.version and network.subnet_of(n) for n in refused):
                return f"{what}, never {why} ({entry[:60]!r})"
    return None


def _ingress_address(value) -> str | None:
    """Where published ports bind: "node" (the agent's route address) or one address."""
    what = '"node" or an IPv4/IPv6 address (not a wildcard or multicast)'
    if value == "node":
        return None
    try:
        address = ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        address = None
    if address is None or address.is_unspecified or address.is_multicast:
        return what
    return None


_reservation_seconds = _whole("seconds", "s", 1, RESERVATION_KNOB_MAX_S)
_agent_seconds = _whole("seconds", "s", 1, AGENT_TIMEOUT_MAX_S)


def runtime_below(runtime: str, required: str) -> bool:
    """Whether `runtime` isolates less than a pool's `required_runtime` asks ("" asks nothing)."""
    if not required:
        return False
    return RUNTIME_STRENGTH.get(runtime or ContainerRuntime.DOCKER, -1) < RUNTIME_STRENGTH[required]


GPU_CLASSES_MAX = 256  # models in gpu_throughput_classes
GPU_CLASS_GFLOPS_MAX = 10_000_000
# FP32 peaks published by NVIDIA (GFLOP/s) × about ½: the challenge's FMA kernel reaches ~90 % of
# peak where the clocks hold; a class is a floor that a wrong model falls through, not a grade
GPU_THROUGHPUT_CLASSES = {
    "NVIDIA H100 80GB HBM3": 33000,  # 67 TFLOP/s
    "NVIDIA H200": 33000,  # 67
    "NVIDIA H100 PCIe": 25000,  # 51
    "NVIDIA L40S": 45000,  # 91.6
    "NVIDIA A100-SXM4-80GB": 9500,  # 19.5
    "NVIDIA A100-SXM4-40GB": 9500,  # 19.5
    "NVIDIA A100 80GB PCIe": 9500,  # 19.5
    "NVIDIA A10": 15000,  # 31.2
    "NVIDIA L4": 15000,  # 30.3
    "Tesla T4": 4000,  # 8.1
}


def _gpu_classes(value) -> str | None:
    """{model as NVML names it: minimum GFLOP/s} (nodes/challenge.py)."""
    what = (
        f"a map of at most {GPU_CLASSES_MAX} GPU models (as NVML names them, ≤ 96 characters)"
        f" to GFLOP/s (numbers above 0, at most {GPU_CLASS_GFLOPS_MAX})"
    )
    if not isinstance(value, dict) or len(value) > GPU_CLASSES_MAX:
        return what
    for model, gflops in value.items():
        number = isinstance(gflops, int | float) and not isinstance(gflops, bool)
        if not (isinstance(model, str) and 0 < len(model) <= 96):
            return what
        if not number or not 0 < gflops <= GPU_CLASS_GFLOPS_MAX:
            return what
    return None


def _fraction_below_one(value) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return None if number and 0 <= value < 1 else "a number from 0 to below 1"


# --- the knobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    check: Callable[[Any], str | None]  # what a value must be, or None when it is valid
    doc: str  # its meaning, one line of docs/scheduler.md's table


def knob(default, check: Callable[[Any], str | None], doc: str) -> Any:
    """A field of PoolKnobs: its default, its check and its meaning."""
    about = {"default": default, "check": check, "doc": doc}
    if isinstance(default, list | dict):  # each instance gets its own copy
        return field(default_factory=lambda: copy.deepcopy(default), metadata=about)
    return field(default=default, metadata=about)


def _queue(name: str, doc: str) -> Any:
    """A queue knob: the core's default and check (placement/queue.py)."""
    return knob(getattr(QueuePolicy, name), QUEUE_KNOBS[name], doc)


@dataclass(frozen=True)
class PoolKnobs:
    """The knobs of a pool's current policy version, every one set (to its default when the
    version does not name it). Who reads each is noted above it."""

    # reservations (leases/services/reserve.py)
    reservation_max_horizon_s: int = knob(
        7 * 24 * 3600,
        _reservation_seconds,
        "how far ahead a reservation window may start (s, 1 … 365 days)",
    )
    reservation_max_hold_s: int = knob(
        24 * 3600, _reservation_seconds, "how long a reservation window may last (s, 1 … 365 days)"
    )
    lease_commit_window_s: int = knob(
        300,
        _reservation_seconds,
        "a lease from the lease API not committed this long after it was reserved expires, and"
        " only a committed one renews (s, 1 … 365 days)",
    )
    reservation_max_tolerance_s: int = knob(
        3600, _reservation_seconds, "how late a reservation may be claimed (s, 1 … 365 days)"
    )
    # submit (jobs/services.py)
    default_priority_class: str = knob(
        "",
        _class_name,
        'the priority class of a job that names none (`""`: none, which ranks a job with the'
        " lowest class; the demo's `lab` names `batch`)",
    )
    # drains (scheduling/drain.py)
    drain_noncheckpointable: str = knob(
        DrainPolicy.FAIL.value,
        _one_of(DrainPolicy.values, f"one of {', '.join(DrainPolicy.values)}"),
        "at a drain deadline, a running job that cannot checkpoint: `fail` stops it, `wait`"
        " lets it run to its end",
    )
    # enrollment (nodes/services/enrollment.py, docs/security.md "Node identity")
    reenrollment_key_mismatch: str = knob(
        "refuse",
        _one_of(("refuse", "quarantine"), 'one of "refuse", "quarantine"'),
        "an enrollment as an existing node with another key than the one bound to it: `refuse`"
        " refuses it, `quarantine` also quarantines the existing node",
    )
    # the GPU challenge of validation and recovery probes (nodes/challenge.py, docs/nodes.md)
    gpu_throughput_classes: Mapping[str, float] = knob(
        GPU_THROUGHPUT_CLASSES,
        _gpu_classes,
        "GPU model (as NVML names it) → the GFLOP/s (FP32 FMA) its challenge kernel must reach;"
        " a model not named is not timed (defaults: about half of NVIDIA's published FP32 peak)",
    )
    gpu_throughput_tolerance: float = knob(
        0.1,
        _fraction_below_one,
        "a GPU passes at its class × (1 − this) or more (0 ≤ it < 1)",
    )
    # the agent's assignment (jobs/assignments.py) and the jobs API
    allow_process_runtime: bool = knob(
        False, _boolean, "jobs may run under the agent's non-isolating local process runtime"
    )
    required_runtime: str = knob(
        "",
        _one_of(REQUIRED_RUNTIMES, 'one of "", "docker", "gvisor"'),
        'the weakest runtime the pool\'s jobs may run under: `""` (none required), `docker` or'
        " `gvisor`",
    )
    startup_timeout_s: int = knob(
        300, _agent_seconds, "how long a container may take to start (s, 1 … 86400)"
    )
    stop_grace_s: int = knob(10, _agent_seconds, "from the stop signal to the kill (s, 1 … 86400)")
    # outputs (jobs/artifacts.py, jobs/services.py)
    output_retention_days: int = knob(
        30,
        _whole("days", "days", 1, RETENTION_MAX_DAYS),
        f"an ended job's outputs and logs are deleted this many days after it ended (1 …"
        f" {RETENTION_MAX_DAYS})",
    )
    output_limit_mib: int = knob(
        1024,
        _whole("MiB", "MiB", 0, OUTPUT_LIMIT_MAX_MIB, low_means=" (no limit)"),
        f"the size of a job's /outputs when it names none (MiB, 0 … {OUTPUT_LIMIT_MAX_MIB}; 0:"
        " no limit, which only the process runtime runs)",
    )
    # persistent volumes (storage/services.py)
    volume_retention_days: int = knob(
        30,
        _whole("days", "days", 1, RETENTION_MAX_DAYS),
        "a volume no job mounts is expired (removed) this many days after its last detach, or"
        " after its creation when never mounted, unless it names its own"
        f" (1 … {RETENTION_MAX_DAYS})",
    )
    # what a job may reach (jobs/networks.py)
    private_ranges_allowed: bool = knob(
        False, _boolean, "jobs may reach private address ranges (inputs and egress)"
    )
    egress_allowed: Sequence[str] = knob(
        [],
        _egress_allowed,
        f"the CIDRs and host names a job's `egress_allow` may name (at most"
        f" {EGRESS_ALLOWED_MAX_ENTRIES}; none inside an always-refused range, no name of the"
        " loopback)",
    )
    ingress_address: str = knob(
        "node",
        _ingress_address,
        "where published ports bind: `node` (the agent's route address) or one IPv4/IPv6"
        " address, not a wildcard or multicast",
    )
    # preemption (scheduling/preemption.py; the core's default)
    preemption_min_runtime_s: int = knob(
        DEFAULT_MIN_RUNTIME_S,
        _whole("seconds", "s", 0, AGENT_TIMEOUT_MAX_S),
        "work younger than this is never preempted (s, 0 … 86400)",
    )
    preemption_notice_s: int = knob(
        10,
        _whole("seconds", "s", 0, AGENT_TIMEOUT_MAX_S),
        "a preemption decided waits this long before its victims are asked to checkpoint, and"
        " is called off if meanwhile it is no longer needed (s, 0 … 86400; 0: at once)",
    )
    # credits (leases/services/credits.py)
    credit_rates: Mapping[str, Mapping[str, float]] = knob(
        {},
        _credit_rates,
        "priority class (or `default`) → rates among `consumed_factor`, `cpu_core_hour`,"
        " `gpu_hour`, `memory_gib_hour` (numbers 0 … 1e9); none: the pool charges nothing",
    )
    # MIG (nodes/services/mig.py, worker_agent/mig.py; docs/scheduler.md "MIG")
    mig_reconfiguration: bool = knob(
        False,
        _boolean,
        "the control plane may ask a node's agent to carve an idle MIG GPU (no lease on it)"
        " into another layout, which the agent creates through NVML as root; UNVERIFIED ON"
        " HARDWARE (tested against a fake NVML only)",
    )
    # the queue's order and gate (scheduling/fairshare.py; the core's defaults and checks)
    fair_share_half_life_s: float = _queue(
        "fair_share_half_life_s", "past use counts half after this long (s, 1 … 365 days)"
    )
    aging_step_s: float = _queue(
        "aging_step_s", "a waiting job gains one priority point per step (s, 1 … 365 days)"
    )
    aging_max_bonus: int = _queue("aging_max_bonus", "at most this many points (0 … 1000000)")
    max_wait_urgent_fraction: float = _queue(
        "max_wait_urgent_fraction",
        "share of its class's max wait after which a job goes first (0 < it ≤ 1)",
    )
    short_job_max_runtime_s: int = _queue(
        "short_job_max_runtime_s",
        "a declared max runtime up to this makes a short job (s, 0 … 365 days)",
    )
    short_job_share: float = _queue(
        "short_job_share",
        "share of each resource kept from long jobs (0 ≤ it < 1; 0: none, a pool opts in, as"
        " the share idles while no short job waits)",
    )
    backfill_reservations: int = _queue(
        "backfill_reservations", "heads the gate protects per pass (1 … 100; 1: EASY)"
    )
    long_job_min_runtime_s: int = _queue(
        "long_job_min_runtime_s", "the forecast's `long` class (s, 1 … 365 days)"
    )

    def queue_policy(self) -> QueuePolicy:
        return QueuePolicy(**{name: getattr(self, name) for name in QUEUE_KNOBS})


KNOBS: dict[str, Knob] = {
    f.name: Knob(f.name, f.metadata["default"], f.metadata["check"], f.metadata["doc"])
    for f in fields(PoolKnobs)
}
DEFAULTS = PoolKnobs()


def policy_version(weights, knobs) -> None:
    """A policy version's weights and knobs, checked at publish time (API, admin, service):
    weights name the core's registered scorers with non-negative numbers (the core's registry
    checks them), knobs are declared here with values their checks accept."""
    errors = policy_problems(weights)
    if not isinstance(knobs, dict):
        errors["knobs"] = ["A map of knob name to its value."]
    elif problems := _knob_problems(knobs):
        errors["knobs"] = problems
    if errors:
        raise ValidationError(errors)


def _knob_problems(knobs: dict) -> list[str]:
    problems = []
    for name, value in knobs.items():
        declared = KNOBS.get(name)
        if declared is None:
            problems.append(f"{name!r} is unknown (known: {', '.join(sorted(KNOBS))}).")
        elif problem := declared.check(value):
            problems.append(f"{name!r} must be {problem}.")
    return problems


# --- reading: one cache of each pool's current version ---------------------------------------

CACHE_SECONDS = 5.0  # how stale a version published by another process may be read


@dataclass
class _Version:
    """A pool's policy version as this process read it; `number` None: the pool has none."""

    number: int | None
    weights: dict | None
    knobs: PoolKnobs
    policies: dict[bool, core.Policy] = field(default_factory=dict)  # by tenant mixing


_NO_VERSION = _Version(None, None, DEFAULTS)
_CACHE: dict[int, tuple[float, _Version]] = {}  # pool id → (when read, its current version)
_PUBLISHING: set[int] = set()  # pools with a publish not yet committed: read afresh, kept nowhere


def knobs_for(pool) -> PoolKnobs:
    """The knobs of a pool (a ComputePool or its id) from its current policy version."""
    return _current(pool if isinstance(pool, int) else pool.pk).knobs


def pool_policy(pool) -> core.Policy:
    """The core policy of the pool's current version: its scorer weights, the pool's rule on
    tenant mixing. A weight name the core does not know raises ValueError, never dropped."""
    version = _current(pool.pk)
    mixing = pool.allow_tenant_mixing_on_shared_gpus
    policy = version.policies.get(mixing)
    if policy is None:
        if version.number is None:  # a pool without a version yet places with the default
            policy = replace(DEFAULT_POLICY, allow_tenant_mixing=mixing)
        else:
            number, weights = version.number, version.weights
            policy = policy_from(weights, version=number, allow_tenant_mixing=mixing)
        version.policies[mixing] = policy
    return policy


def version_published(pool_id: int) -> None:
    """Called by the publish service in its transaction, after writing the version: until it
    commits, this process reads the pool's version afresh and keeps none (its transaction sees
    the new one, others the old); once it commits, the cached one goes. A publish that rolls
    back leaves the pool read afresh in this process until a later publish commits."""
    _PUBLISHING.add(pool_id)
    transaction.on_commit(lambda: _forget(pool_id))


def _forget(pool_id: int) -> None:
    _CACHE.pop(pool_id, None)
    _PUBLISHING.discard(pool_id)


def _current(pool_id: int | None) -> _Version:
    if pool_id is None:  # an unsaved pool has no version
        return _NO_VERSION
    now = time.monotonic()
    cached = _CACHE.get(pool_id)
    if cached is not None and now - cached[0] < CACHE_SECONDS and pool_id not in _PUBLISHING:
        return cached[1]
    row = (
        SchedulingPolicyVersion.objects.filter(policy__pool_id=pool_id)
        .order_by("-number")
        .values("number", "weights", "knobs")
        .first()
    )
    if row is None:  # no version yet: every default, the default policy
        version = _NO_VERSION
    elif cached is not None and cached[1].number == row["number"]:
        version = cached[1]  # still current: kept, with the policies built from it
    else:
        version = _read(pool_id, row)
    if pool_id not in _PUBLISHING:
        _CACHE[pool_id] = (now, version)
    return version


def _read(pool_id: int, row: dict) -> _Version:
    stored = row["knobs"] if isinstance(row["knobs"], dict) else {}
    values = {}
    for name, value in stored.items():
        declared = KNOBS.get(name)
        if declared is None:
            continue  # not a knob (any more): nothing reads it
        if problem := declared.check(value):
            logger.warning(
                "pool %s policy version %s: %s must be %s; its default applies",
                pool_id,
                row["number"],
                name,
                problem,
            )
            continue
        values[name] = value
    return _Version(row["number"], row["weights"], PoolKnobs(**values))
