"""What a pass knows of persistent volumes (docs/storage.md "Persistent volumes"): a job that
writes a volume waits while another job writes it (`volume_in_use`), and a job pinned to its
volumes' node that cannot be placed says why in the volume's words: `volume_node_full` (the
node is there, without room) or `volume_node_unavailable` (draining, quarantined, retired or
unreachable; a volume's export, drain-exempt, waits on a draining node for room)."""

from __future__ import annotations

from jobs.choices import JobState
from jobs.models import Job
from nodes.choices import NodeState, Reachability
from nodes.models import Node
from pools.reasons import Reason
from storage.models import Volume

# a job in one of these holds its volumes (or is placed to, and attaches them as it starts)
ON_NODE = (JobState.LEASED, JobState.STARTING, JobState.RUNNING, JobState.CHECKPOINTING)
# the waits the volume's words replace: the core found no room (or no ready node) for it
REPLACED = (Reason.NO_CAPACITY.value, Reason.NO_READY_NODE.value, "never_fits")


class VolumeWriters:
    """The volumes written now, read once per pass when a job of the window writes one, and
    the ones the pass admitted a writer for since."""

    def __init__(self, pool_id: int):
        self.pool_id = pool_id
        self._held: dict[int, int] | None = None  # volume id → the job that writes it

    def _load(self) -> dict[int, int]:
        held = dict(
            Volume.objects.filter(pool_id=self.pool_id, holder_job_id__isnull=False).values_list(
                "pk", "holder_job_id"
            )
        )
        placed = Job.objects.filter(
            pool_id=self.pool_id, state__in=ON_NODE, resources__has_key="volume_writes"
        ).values_list("pk", "resources__volume_writes")
        for job_id, writes in placed:
            for volume_id in writes or ():
                held.setdefault(int(volume_id), job_id)
        return held

    def claims(self) -> dict[int, int] | None:
        """What is claimed now, to `restore` when a trial is not committed."""
        return None if self._held is None else dict(self._held)

    def restore(self, claims: dict[int, int] | None) -> None:
        self._held = claims

    def refusal(self, job) -> dict | None:
        """Why `job` may not take its volumes now (None: it may; then they are its own)."""
        writes = (job.resources or {}).get("volume_writes")
        if not writes:
            return None
        if self._held is None:
            self._held = self._load()
        busy = [v for v in writes if self._held.get(int(v), job.pk) != job.pk]
        if busy:
            return {
                "code": Reason.VOLUME_IN_USE.value,
                "message": f"volume {busy[0]} is mounted read-write by another job; this job "
                "waits for it to end",
                "volume": busy[0],
            }
        for volume_id in writes:
            self._held[int(volume_id)] = job.pk
        return None


def writer_refusal_locked(job) -> dict | None:
    """The single path's one-writer rule (`single._reserve_and_place`), inside the placement's
    transaction: the volumes `job` writes are locked (in id order: two such placements take
    turns, and a delete or an attach waits for this one), then read as they are now: held by
    another job, or another job placed to write them (leased … checkpointing), refuses
    `volume_in_use`. None: it may write them."""
    writes = sorted({int(v) for v in (job.resources or {}).get("volume_writes") or ()})
    if not writes:
        return None
    held = dict(
        Volume.objects.select_for_update()
        .filter(pk__in=writes)
        .order_by("pk")
        .values_list("pk", "holder_job_id")
    )
    placed = (
        Job.objects.filter(
            pool_id=job.pool_id, state__in=ON_NODE, resources__has_key="volume_writes"
        )
        .exclude(pk=job.pk)
        .values_list("pk", "resources__volume_writes")
    )
    for other, other_writes in placed:
        for volume_id in other_writes or ():
            if int(volume_id) in held and held[int(volume_id)] in (None, job.pk):
                held[int(volume_id)] = other
    busy = [v for v in writes if held.get(v) not in (None, job.pk)]
    if not busy:
        return None
    return {
        "code": Reason.VOLUME_IN_USE.value,
        "message": f"volume {busy[0]} is mounted read-write by another job; this job waits for "
        "it to end",
        "volume": busy[0],
    }


_RUNS_ON = frozenset({NodeState.READY})
_EXEMPT_RUNS_ON = frozenset({NodeState.READY, NodeState.DRAINING})


def node_words(pool_id: int, planned: list) -> None:
    """The waits of jobs pinned to their volumes' node, told in the volume's words."""
    waiting = [
        p
        for p in planned
        if p.placement is None
        and p.explanation
        and (p.job.resources or {}).get("volume_node")
        and p.explanation.get("code") in REPLACED
    ]
    if not waiting:
        return
    names = {p.job.resources["volume_node"] for p in waiting}
    nodes = {
        n["name"]: n
        for n in Node.objects.filter(pool_id=pool_id, name__in=names).values(
            "name", "state", "reachability"
        )
    }
    for p in waiting:
        name = p.job.resources["volume_node"]
        node = nodes.get(name)
        state = node["state"] if node else "gone"
        unreachable = node is not None and node["reachability"] == Reachability.UNREACHABLE
        # a drain-exempt job (a volume's export) runs on a draining node too: it waits for room
        runs_on = _EXEMPT_RUNS_ON if p.job.resources.get("drain_exempt") is True else _RUNS_ON
        if node is None or state not in runs_on or unreachable:
            shown = f"{state}, unreachable" if unreachable else state
            code = Reason.VOLUME_NODE_UNAVAILABLE.value
            message = (
                f"Its volumes live on node {name}, which is {shown}: it waits for the node "
                "(export a volume to move its data: POST /api/v1/volumes/{id}/export)."
            )
        else:
            code = Reason.VOLUME_NODE_FULL.value
            message = (
                f"Its volumes live on node {name}, which has no room for it now: it waits "
                "there (a node-local volume never moves)."
            )
            shown = state
        p.explanation = {
            **p.explanation,
            "code": code,
            "message": message,
            "node": name,
            "node_state": shown,
        }
