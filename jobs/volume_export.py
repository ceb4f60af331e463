"""A persistent volume copied to a bucket its tenant registered (`POST /api/v1/volumes/{id}/
export`, docs/storage.md "Persistent volumes"): a normal job of the tenant, on the volume's node.

The volume lives on one node's disk only, so the copy runs there: a job that mounts it
read-only at `/mnt/volume` and writes one tar of it, `/outputs/volume.tar`, which the agent
uploads to the destination like any s3:// output (key `<prefix><job>/<attempt>/volume.tar`).
One tar rather than the files themselves: outputs are the top-level regular files of /outputs
only, and a volume's files sit in folders, with owners and modes a tar keeps.

The job's body (`export_body`) goes through the submit's own checks (the route runs it
through JobSubmitSerializer: the tenant's role, the bucket registered by the tenant, the image
admitted by the pool, the mount itself) and `jobs.services.job_submit` (`volume_export`); its
volume's node pins it like every job that mounts a volume. Its `/outputs` is the volume's size
and a margin for the tar's headers, reserved on the node's disk while it runs.
The volume gets a `volume_export_requested` event naming the job.

A volume whose node is being drained is at risk, and that is when its data must be copied off:
the export job alone is drain-exempt (`job_submit(drain_exempt=True)`, the key `drain_exempt`
in its request, which no submit body can carry), so the core's `node_schedulable` filter, the
snapshot and the ledger's guarded UPDATE let it on the draining node (docs/storage.md,
docs/scheduler.md, docs/nodes.md). A quarantined, retired or unreachable node runs nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from rest_framework import serializers

from nodes.choices import NodeState, Reachability
from pools import knobs
from pools.actors import Actor
from pools.choices import TenantRole
from pools.reasons import Reason
from pools.roles import tenant_roles
from pools.statemachine import Refusal
from storage.choices import LIVE
from storage.models import Volume, VolumeEvent

from .models import Job
from .services import job_submit

MOUNT_PATH = "/mnt/volume"
ARCHIVE = "volume.tar"
# the tar's headers and end blocks on top of the files (512 bytes a file, 10 KiB at the end)
TAR_MARGIN_MIB = 16
EXPORT_MAX_RUNTIME_S = 24 * 3600
# the node states an export runs on (reachable ones): a drain lets the export in, drain-exempt
EXPORTS_RUN_ON = frozenset({NodeState.READY, NodeState.DRAINING})


class ExportRefused(Refusal):
    """An export the volume's state or its node's refuses now (409 with its code)."""

    status = 409


class ExportForbidden(Refusal):
    """The caller sees the volume but is not one of its tenant's people (an operator)."""

    status = 403
    code = "permission_denied"


def export_command() -> list[str]:
    """What the export job runs: the volume's tree, owners and modes, in one tar. Through `sh`,
    whose busybox build runs its own `tar` applet where the image links no `tar` command."""
    return ["sh", "-c", f"tar -cf /outputs/{ARCHIVE} -C {MOUNT_PATH} ."]


def _check_volume(volume: Volume) -> None:
    """A live volume whose node can run its export now: reachable, and ready or draining (a
    drain takes no new work but the export, drain-exempt, which rescues the volume's data).
    Quarantined, retired or unreachable ones refuse."""
    if volume.state not in LIVE:
        raise ExportRefused(
            f"Volume {volume.name} is {volume.state}: there is nothing left to export.",
            code=Reason.VOLUME_GONE,
        )
    node = volume.node
    unreachable = node.reachability == Reachability.UNREACHABLE
    if node.state in EXPORTS_RUN_ON and not unreachable:
        return
    shown = f"{node.state}, unreachable" if unreachable else node.state
    if unreachable:
        why = "its agent does not answer, so nothing can run there to copy the volume"
    else:
        why = "it takes no work now"
    raise ExportRefused(
        f"Volume {volume.name} lives on node {node.name}, which is {shown}: {why}.",
        code=Reason.VOLUME_NODE_UNAVAILABLE,
        extra={"node": node.name, "node_state": shown},
    )


def _body(volume: Volume, destination: str) -> dict:
    resources = {"cpu_millicores_min": 100, "memory_mib_min": 64}
    if required := knobs.knobs_for(volume.pool).required_runtime:
        resources["container_runtime"] = required
    return {
        "tenant": volume.tenant.slug,
        "pool": volume.pool.slug,
        "name": f"export-volume-{volume.name}",
        "resources": resources,
        "image": settings.VOLUME_EXPORT_IMAGE,
        "command": export_command(),
        "volumes": [{"volume": volume.pk, "path": MOUNT_PATH, "read_only": True}],
        "output_destination": destination,
        "output_limit_mib": volume.size_mib + TAR_MARGIN_MIB,
        "network_policy": {"mode": "none"},  # the agent uploads; the container needs no network
        "max_runtime_s": EXPORT_MAX_RUNTIME_S,
    }


def field_errors(errors: dict) -> dict:
    """The submit's field errors in the export's words: its `destination`, and the rest as
    what they are about (the volume, the tenant's quota …)."""
    renamed = {"output_destination": "destination"}
    return {renamed.get(field, field): value for field, value in errors.items()}


def export_body(*, volume: Volume, destination, user) -> dict:
    """The export job's submit body, for JobSubmitSerializer; refused before that 400 on
    `destination` unless an s3:// prefix, 403 for someone who sees the volume without being
    one of its tenant's people, 409 when the volume is gone or its node cannot run it now."""
    if not isinstance(destination, str) or not destination.startswith("s3://"):
        raise serializers.ValidationError(
            {"destination": ["A bucket the tenant registered: s3://bucket/prefix/."]}
        )
    if tenant_roles(user).get(volume.tenant_id) not in (TenantRole.MEMBER, TenantRole.ADMIN):
        raise ExportForbidden("Only the people of the volume's tenant may export it.")
    _check_volume(volume)
    return _body(volume, destination)


def volume_export(*, volume: Volume, submit: dict, actor: Actor) -> Job:
    """The export job queued (`submit`: its body as JobSubmitSerializer validated it),
    drain-exempt, and the volume's `volume_export_requested` event, in one transaction."""
    with transaction.atomic():
        # drain-exempt: placed on the volume's node while it drains too (the only such job)
        job = job_submit(actor=actor, **submit, drain_exempt=True)
        locked = Volume.objects.select_for_update().get(pk=volume.pk)
        VolumeEvent.record(
            locked,
            actor=actor,
            from_state=locked.state,
            to_state=locked.state,
            reason=Reason.VOLUME_EXPORT_REQUESTED,
            message=f"job {job.pk} copies it to {job.output_destination}{job.pk}/…/{ARCHIVE}",
            data={"job": job.pk, "destination": job.output_destination},
        )
    return job
