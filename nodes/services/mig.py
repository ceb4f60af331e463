"""Another MIG layout for an idle GPU, asked of its node's agent (docs/scheduler.md "MIG").

UNVERIFIED ON HARDWARE: the agent's side (worker_agent/mig.py apply_layout) is tested against
a fake NVML only. Pools opt in with the knob `mig_reconfiguration` (off by default).

`mig_layout_request` records the request as a `mig_layout_requested` node event (no column:
the event is the request) after the guard rails: the pool's knob on, the GPU in MIG mode, no
lease on it (nothing reserved on the ledger), every instance a profile of that GPU at one of
its valid starts, none overlapping. `mig_layouts_open` is what the heartbeat answer carries
(`mig_layouts`): each GPU's newest request while its reported layout differs, the knob is
still on and the GPU is still idle. The agent carves it and reports the new inventory, which
the reconciliation takes like any drift; from then on the scheduler places on it.
"""

from __future__ import annotations

from django.utils import timezone

from placement.mig import occupied_slices, profiles_for
from placement.types import MigSlice
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.reasons import Reason

from ..inventory import mig_layout_of
from ..models import GpuDevice, Node
from .base import node_event

REQUESTS_READ = 64  # the newest requests looked at per heartbeat


class MigLayoutRefused(ValueError):
    """A layout request the guard rails refuse; `code` says which."""

    def __init__(self, code: str, message: str):
        self.code, self.message = code, message
        super().__init__(f"{code}: {message}")


def _idle(gpu: GpuDevice) -> bool:
    return gpu.milli_reserved == 0 and gpu.mig_slots_used == 0


def layout_problems(gpu: GpuDevice, layout) -> str:
    """Why `layout` ([{"profile", "start"}]) cannot be carved on `gpu` ("" when it can)."""
    if not isinstance(layout, list) or not layout or len(layout) > 8:
        return "a layout is a list of 1 to 8 instances"
    profiles = profiles_for(gpu.model, gpu.memory_mib)
    used: set[int] = set()
    for item in layout:
        if not isinstance(item, dict):
            return "each instance is {profile, start}"
        profile = profiles.get(item.get("profile"))
        start = item.get("start")
        if profile is None or not isinstance(start, int) or start not in profile.starts:
            return f"not a placement on {gpu.model}: {item!r:.80}"
        slots = occupied_slices((MigSlice(profile.name, start),), profiles)
        if slots & used:
            return f"instances overlap at {item['profile']}@{start}"
        used |= slots
    return ""


def mig_layout_request(*, node: Node, gpu: GpuDevice, layout: list, actor: Actor, now=None):
    """Ask the node's agent to carve `gpu` into `layout`; raises MigLayoutRefused."""
    if not knobs_for(node.pool).mig_reconfiguration:
        raise MigLayoutRefused("mig_reconfiguration_off", "the pool does not allow it")
    gpu = GpuDevice.objects.get(pk=gpu.pk, node=node)
    if not gpu.mig_enabled:
        raise MigLayoutRefused("mig_disabled", f"gpu {gpu.index} is not in MIG mode")
    if not _idle(gpu):
        raise MigLayoutRefused("gpu_in_use", f"gpu {gpu.index} holds a lease")
    problem = layout_problems(gpu, layout)
    if problem:
        raise MigLayoutRefused("mig_layout_invalid", problem)
    layout = [{"profile": item["profile"], "start": item["start"]} for item in layout]
    return node_event(
        node,
        actor=actor,
        reason=Reason.MIG_LAYOUT_REQUESTED,
        message=f"gpu {gpu.index}: " + ", ".join(f"{i['profile']}@{i['start']}" for i in layout),
        now=now or timezone.now(),
        data={"gpu": gpu.uuid, "layout": layout},
    )


def mig_layouts_open(node: Node) -> list[dict]:
    """The heartbeat answer's `mig_layouts`: [{"gpu": UUID, "layout": [...]}], [] unless the
    pool allows reconfiguration."""
    if not knobs_for(node.pool).mig_reconfiguration:
        return []
    gpus = {g.uuid: g for g in node.gpus.filter(mig_enabled=True)}
    if not gpus:
        return []
    newest: dict[str, list] = {}
    requested = node.events.filter(reason=Reason.MIG_LAYOUT_REQUESTED).order_by("-id")
    for event in requested[:REQUESTS_READ]:
        uuid = (event.data or {}).get("gpu")
        if uuid in gpus and uuid not in newest:
            newest[uuid] = (event.data or {}).get("layout") or []
    out = []
    for uuid, layout in newest.items():
        gpu = gpus[uuid]
        if not _idle(gpu) or mig_layout_of({"mig_slices": layout}) == mig_layout_of(
            {"mig_slices": gpu.mig_slices}
        ):
            continue
        out.append({"gpu": uuid, "layout": layout})
    return out
