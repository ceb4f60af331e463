"""Probes: a validation probe checks a marketplace node's claims; a recovery probe checks a
device that was taken out of scheduling. Only the probed node's own credential may answer."""

import logging
import secrets
import time

from django.db import transaction
from django.utils import timezone

from pools.actors import Actor
from pools.images import parse_image_reference
from pools.knobs import knobs_for
from pools.reasons import Reason
from pools.registry import RegistryError, resolve
from pools.statemachine import TransitionRefused

from ..challenge import (
    SEED_HEX,
    build_challenge,
    build_gpu_challenge,
    challenge_differences,
    gpu_challenge_differences,
    gpu_reason,
)
from ..choices import GpuHealth, ProbeKind, ProbeState
from ..claims import compare_claims
from ..conf import setting
from ..errors import NodeScopeRefused
from ..health_rules import gpu_health_evaluate
from ..models import GpuDevice, Node, NodeCredential, NodeProbe
from .base import node_event
from .lifecycle import node_mark_ready, node_quarantine, node_verify

log = logging.getLogger(__name__)


def probe_image() -> str:
    """NODE_PROBE_IMAGE pinned to its digest (the agent runs images by digest only); "" when
    the registry cannot say, and the probe then fails saying so."""
    text = setting("NODE_PROBE_IMAGE")
    try:
        ref = parse_image_reference(text)
        if ref.digest:
            return text
        return resolve(ref.registry, ref.repository, ref.tag or "latest").pinned
    except (ValueError, RegistryError) as exc:
        log.warning("probe image %r cannot be pinned: %s", text, exc)
        return ""


GPU_IMAGE_CACHE_S = 300
_gpu_images: dict[str, tuple[str, float]] = {}


def gpu_probe_image() -> str:
    """NODE_GPU_PROBE_IMAGE pinned to its digest, kept GPU_IMAGE_CACHE_S in this process (a
    recovery probe is requested inside a heartbeat); "" when unset or unpinnable: the GPU
    challenge then runs only where no container runtime is (the process runtime), and a Docker
    node answers that it has no image."""
    text = setting("NODE_GPU_PROBE_IMAGE")
    if not text:
        return ""
    cached = _gpu_images.get(text)
    if cached and cached[1] > time.monotonic():
        return cached[0]
    try:
        ref = parse_image_reference(text)
        pinned = (
            text
            if ref.digest
            else resolve(ref.registry, ref.repository, ref.tag or "latest").pinned
        )
    except (ValueError, RegistryError) as exc:
        log.warning("GPU probe image %r cannot be pinned: %s", text, exc)
        return ""
    _gpu_images[text] = (pinned, time.monotonic() + GPU_IMAGE_CACHE_S)
    return pinned


def gpu_challenge(node: Node, gpus: list[dict]) -> dict:
    """The GPU part of a probe's challenge, for `gpus` (inventory entries) of the node's pool:
    {"gpus": [one per whole GPU], "image"}; {} when there is none to challenge."""
    knobs = knobs_for(node.pool_id)
    challenges = build_gpu_challenge(
        gpus,
        classes=dict(knobs.gpu_throughput_classes),
        tolerance=knobs.gpu_throughput_tolerance,
        reserve_mib=setting("NODE_GPU_CHALLENGE_RESERVE_MIB"),
        samples=setting("NODE_GPU_CHALLENGE_SAMPLES"),
        fma_seconds=setting("NODE_GPU_CHALLENGE_FMA_SECONDS"),
        unclassed_gflops=setting("NODE_GPU_CHALLENGE_UNCLASSED_GFLOPS"),
        rng=secrets.SystemRandom(),
    )
    return {"gpus": challenges, "image": gpu_probe_image()} if challenges else {}


def recovery_challenge(node: Node, gpu: GpuDevice) -> dict:
    """A recovery probe runs the same kernel on its one device."""
    claimed = next(
        (g for g in (node.inventory or {}).get("gpus") or [] if g.get("uuid") == gpu.uuid),
        {"uuid": gpu.uuid, "model": gpu.model, "memory_mib": gpu.memory_mib},
    )
    kernel = gpu_challenge(node, [claimed])
    return {"gpu_kernel": kernel} if kernel else {}


def probe_challenge(node: Node) -> dict:
    """A fresh challenge for the node's claims: a new seed for every probe."""
    kernel = gpu_challenge(node, (node.inventory or {}).get("gpus") or [])
    return ({"gpu_kernel": kernel} if kernel else {}) | build_challenge(
        node.inventory or {},
        seed=secrets.token_hex(SEED_HEX // 2),
        image=probe_image(),
        iterations=setting("NODE_PROBE_ITERATIONS"),
        workers_max=setting("NODE_PROBE_WORKERS_MAX"),
        memory_max_mib=setting("NODE_PROBE_MEMORY_MAX_MIB"),
        seconds_per_iteration=setting("NODE_PROBE_SECONDS_PER_ITERATION"),
        seconds_base=setting("NODE_PROBE_SECONDS_BASE"),
    )


def probe_request(
    *, node: Node, kind: str, actor: Actor, gpu: GpuDevice | None = None, now=None
) -> NodeProbe:
    now = now or timezone.now()
    validation = kind == ProbeKind.VALIDATION
    # the registry: outside the lock
    challenge = probe_challenge(node) if validation else recovery_challenge(node, gpu)
    with transaction.atomic():
        # one open probe of a kind per node (per device for recovery)
        open_probe = NodeProbe.objects.filter(
            node=node, kind=kind, gpu=gpu, state=ProbeState.REQUESTED
        ).first()
        if open_probe is not None:
            return open_probe
        expected = node.inventory if validation else {"uuid": gpu.uuid}
        probe = NodeProbe.objects.create(
            node=node,
            gpu=gpu,
            kind=kind,
            expected=expected,
            challenge=challenge,
            requested_at=now,
        )
        what = f"device {gpu.uuid}" if gpu else "the node's claims"
        node_event(
            node,
            actor=actor,
            reason=Reason.PROBE_REQUESTED,
            message=f"{kind} probe {probe.pk} requested for {what}",
            now=now,
            data={"probe": probe.pk, "kind": kind},
        )
    return probe


def probe_result_submit(
    *, probe: NodeProbe, credential: NodeCredential, result: dict, now=None
) -> NodeProbe:
    """Accept a probe result only from the probed node's own credential, then act on it."""
    now = now or timezone.now()
    actor = Actor.for_node(credential.node)
    with transaction.atomic():
        probe = (
            NodeProbe.objects.select_for_update(of=("self",))
            .select_related("node", "gpu")
            .get(pk=probe.pk)
        )
        if probe.node_id != credential.node_id:
            raise NodeScopeRefused(f"probe {probe.pk} belongs to another node")
        if probe.state != ProbeState.REQUESTED:
            raise TransitionRefused("probe_closed", f"probe {probe.pk} is already {probe.state}")
        node = probe.node
        kernel = (probe.challenge or {}).get("gpu_kernel") or {}
        gpu_diffs = gpu_challenge_differences(kernel.get("gpus"), result.get("gpu_kernel"))
        if probe.kind == ProbeKind.VALIDATION:
            diffs = compare_claims(probe.expected, result)
            diffs += challenge_differences(probe.challenge, result.get("challenge"))
        else:
            health, _flags, why = gpu_health_evaluate(result)
            diffs = [] if result.get("passed") and health == GpuHealth.OK else [why or "failed"]
        # the reason: a GPU's (wrong, missing, slow) unless a recovery's readings failed first
        recovery_failed = bool(diffs) and probe.kind != ProbeKind.VALIDATION
        gpu_verdict = None if recovery_failed else gpu_reason(code for code, _w in gpu_diffs)
        diffs += [words for _code, words in gpu_diffs]
        probe.state = ProbeState.FAILED if diffs else ProbeState.PASSED
        probe.result = result
        probe.differences = diffs
        probe.completed_at = now
        probe.reported_by = credential
        probe.save(update_fields=["state", "result", "differences", "completed_at", "reported_by"])
        data = {"probe": probe.pk, "differences": diffs}
        if gpu_diffs:
            data["gpu_challenge"] = [{"reason": c, "difference": w} for c, w in gpu_diffs]
        if probe.kind == ProbeKind.VALIDATION:
            if diffs:
                node_quarantine(
                    node=node,
                    actor=actor,
                    reason=gpu_verdict or Reason.PROBE_MISMATCH,
                    message="probe contradicted the claims: " + "; ".join(diffs),
                    data=data,
                    now=now,
                )
            else:
                node = node_verify(
                    node=node,
                    actor=actor,
                    reason=Reason.PROBE_PASSED,
                    message=f"probe {probe.pk} matched the claims",
                    now=now,
                    data=data,
                )
                node_mark_ready(
                    node=node,
                    actor=Actor.system("verification"),
                    reason=Reason.PROBE_PASSED,
                    message="verified by probe",
                    now=now,
                )
        elif diffs:
            node_event(
                node,
                actor=actor,
                reason=gpu_verdict or Reason.PROBE_FAILED,
                message=f"recovery probe of {probe.gpu.uuid} failed: " + "; ".join(diffs),
                now=now,
                data=data,
            )
        else:
            gpu_recover(gpu=probe.gpu, actor=actor, probe=probe, now=now)
    return probe


def gpu_recover(*, gpu: GpuDevice, actor: Actor, probe: NodeProbe, now=None) -> bool:
    now = now or timezone.now()
    changed = GpuDevice.objects.filter(pk=gpu.pk, healthy=False).update(
        healthy=True, health=GpuHealth.OK, health_flags=[], health_reason="", health_changed_at=now
    )
    if changed:
        node_event(
            Node.objects.get(pk=gpu.node_id),
            actor=actor,
            reason=Reason.GPU_RECOVERED,
            message=f"gpu {gpu.index} ({gpu.uuid}) schedulable again: recovery probe passed",
            now=now,
            data={"gpu": gpu.uuid, "probe": probe.pk},
        )
    return bool(changed)
