"""The MIG layout plan in the control loop (docs/scheduler.md "MIG", the layout plan).

UNVERIFIED ON HARDWARE: what it asks is carried out by the agent (worker_agent/mig.py
apply_layout), tested against a fake NVML only; this side is tested on PostgreSQL without a GPU.

Every pool whose knob `mig_reconfiguration` is on (off by default): the demand is its queued MIG
jobs whose `pending_reason` says no slice of their profile fits (`no_capacity` with
`insufficient_gpu` among its reasons), each a `MigWait` of its profile, its gpu_count slices, how
long it has waited in the queue (since it was queued) and the GPU models it accepts; the GPUs are
its ready, reachable nodes' healthy MIG-mode GPUs, each with its reported layout, the slices its
leases hold and its newest `mig_layout_requested` event (how long ago; its layout while the GPU
has not reported it). The pure `placement.mig.plan_layouts` chooses; each choice is asked through
`nodes.services.mig.mig_layout_request` (its guard rails again, its event with its reason), one
node at a time through `pools.sweeps.sweep` (the node's row locked, SKIP LOCKED; a failure is
recorded on that node as `sweep_failed` and the others go on; a refusal of the guard rails, such
as a lease that came meanwhile, is no failure: the answer says which). One pool's failure is
logged and the other pools go on.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from leases.node_views import mig_layout
from nodes.choices import NodeState, Reachability
from nodes.inventory import mig_layout_of
from nodes.models import GpuDevice, Node, NodeEvent
from nodes.services.mig import MigLayoutRefused, mig_layout_request
from placement.mig import LayoutChoice, LayoutRules, MigGpu, MigWait, plan_layouts
from placement.reasons import INSUFFICIENT_GPU
from placement.types import MigSlice
from pools.actors import Actor
from pools.choices import GpuSharingClass
from pools.knobs import knobs_for
from pools.models import ComputePool
from pools.reasons import Reason
from pools.statemachine import error_summary
from pools.sweeps import sweep

logger = logging.getLogger(__name__)

PLANNER = Actor.system("mig_planner")
RULES = LayoutRules()  # at most 2 GPUs a pool per run, waits ≥ 60 s, a GPU settles 10 min
DEMAND_READ = 2000  # the longest-waiting queued MIG jobs read per pool and run
REQUESTS_READ = 1000  # the newest layout requests read per pool and run


def mig_demand(pool, now: datetime) -> list[MigWait]:
    """The pool's queued MIG jobs that wait for a slice of their profile, longest first."""
    rows = (
        Job.objects.filter(
            pool=pool,
            state=JobState.QUEUED,
            resources__gpu_sharing_class=GpuSharingClass.MIG,
            pending_reason__code="no_capacity",
            pending_reason__reasons__has_key=INSUFFICIENT_GPU,
        )
        .order_by("state_changed_at", "pk")
        .values_list("resources", "state_changed_at")[:DEMAND_READ]
    )
    waits = []
    for resources, since in rows:
        profile = (resources or {}).get("mig_profile")
        if not isinstance(profile, str) or not profile:
            continue
        waits.append(
            MigWait(
                profile=profile,
                slices=max(1, int(resources.get("gpu_count") or 1)),
                waited_s=(now - since).total_seconds(),
                models=tuple(str(m) for m in resources.get("gpu_models") or ()),
            )
        )
    return waits


def _slices(layout) -> tuple[MigSlice, ...]:
    return tuple(
        MigSlice(str(s.get("profile")), int(s.get("start", 0)))
        for s in layout or ()
        if isinstance(s, dict) and isinstance(s.get("start"), int)
    )


def mig_gpus(pool, now: datetime) -> tuple[list[MigGpu], dict[str, GpuDevice]]:
    """The pool's MIG GPUs the plan may count on (ready and reachable nodes, healthy devices),
    as the core sees them, in node and index order; and each GPU's row by UUID."""
    rows = list(
        GpuDevice.objects.filter(
            node__pool=pool,
            node__state=NodeState.READY,
            node__reachability=Reachability.REACHABLE,
            mig_enabled=True,
            healthy=True,
        ).order_by("node_id", "index")
    )
    rows = [g for g in rows if not g.health_flags]
    if not rows:
        return [], {}
    newest: dict[str, tuple[datetime, list]] = {}
    requested = NodeEvent.objects.filter(
        node_id__in={g.node_id for g in rows}, reason=Reason.MIG_LAYOUT_REQUESTED
    ).order_by("-id")
    for at, data in requested.values_list("at", "data")[:REQUESTS_READ]:
        uuid = (data or {}).get("gpu")
        if isinstance(uuid, str) and uuid not in newest:
            newest[uuid] = (at, (data or {}).get("layout") or [])
    gpus = []
    for row in rows:
        since, pending = None, None
        if row.uuid in newest:
            at, layout = newest[row.uuid]
            since = (now - at).total_seconds()
            reported = mig_layout_of({"mig_slices": row.mig_slices})
            if mig_layout_of({"mig_slices": layout}) != reported:
                pending = _slices(layout)
        gpus.append(
            MigGpu(
                uuid=row.uuid,
                model=row.model,
                memory_mib=row.memory_mib,
                layout=mig_layout(row.mig_slices),
                used=frozenset(bit for bit in range(8) if row.mig_slots_used >> bit & 1),
                idle=row.milli_reserved == 0 and row.mig_slots_used == 0,
                since_request_s=since,
                requested=pending,
            )
        )
    return gpus, {row.uuid: row for row in rows}


def plan_pool(pool, now: datetime, rules: LayoutRules = RULES) -> tuple[list, dict]:
    """The layouts the plan chooses for the pool now, and the GPU rows they name."""
    demand = mig_demand(pool, now)
    if not demand:
        return [], {}
    gpus, rows = mig_gpus(pool, now)
    return plan_layouts(demand, gpus, rules), rows


def request_layouts(choices: list[LayoutChoice], rows: dict[str, GpuDevice], now) -> dict:
    """Each choice asked of its GPU's node, a node at a time (its row locked): {GPU UUID:
    "requested" or the refusal's code}; a node that failed is recorded on it and left out."""
    by_node: dict[int, list[LayoutChoice]] = {}
    for choice in choices:
        by_node.setdefault(rows[choice.uuid].node_id, []).append(choice)

    def ask(node: Node) -> dict[str, str]:
        answers = {}
        for choice in by_node[node.pk]:
            layout = [{"profile": s.profile, "start": s.start} for s in choice.layout]
            serves = ", ".join(f"{n}× {p}" for p, n in sorted(choice.serves.items()))
            try:
                mig_layout_request(
                    node=node, gpu=rows[choice.uuid], layout=layout, actor=PLANNER, now=now
                )
                answers[choice.uuid] = "requested"
                logger.info("MIG layout asked of %s (waiting: %s)", choice.uuid, serves)
            except MigLayoutRefused as refused:
                answers[choice.uuid] = refused.code
        return answers

    done = sweep(
        Node.objects.filter(pk__in=by_node, state=NodeState.READY),
        ask,
        event_model=NodeEvent,
        actor=PLANNER,
        now=now,
    )
    return {uuid: answer for answers in done.values() for uuid, answer in answers.items()}


def mig_plan(now: datetime | None = None, rules: LayoutRules = RULES) -> dict[int, dict]:
    """Every pool with `mig_reconfiguration` on: {pool id: {GPU UUID: answer}} (or {"error":
    …} for a pool whose plan failed; the other pools go on)."""
    now = now or timezone.now()
    out: dict[int, dict] = {}
    for pool in ComputePool.objects.order_by("pk"):
        try:
            if not knobs_for(pool).mig_reconfiguration:
                continue
            choices, rows = plan_pool(pool, now, rules)
            out[pool.pk] = request_layouts(choices, rows, now) if choices else {}
        except Exception as error:
            logger.exception("MIG layout plan of pool %s failed", pool.pk)
            out[pool.pk] = {"error": error_summary(error)}
    return out
