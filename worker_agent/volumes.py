"""Persistent volumes on this node (docs/storage.md "Persistent volumes").

Each volume is a filesystem of its size, made like a job's /outputs (worker_agent/runtime/
disks.py: a sparse image, ext4 without journal or reserved blocks, its root owned by the job's
user, loop-mounted nosuid,nodev) but in the work root's `volumes/` folder, outside every
attempt's directory: `<work root>/volumes/<id>.img`, mounted at `<work root>/volumes/<id>/`.
An attempt's cleanup (`disks.release` of its directory, `WorkRoot.sweep`) never reaches it. It
is made on the first job that mounts it, mounted again by the next (after an agent restart
too), and bind-mounted into each job's container at the job's path, read-only when asked.

The agent reports the volumes it holds (`POST /api/v1/agent/volumes`, with the bytes each
uses) with its heartbeats; the control plane answers which ones are deleted or expired, and
their images go: a volume deleted while the node was offline goes when it comes back."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from worker_agent.runtime import disks
from worker_agent.runtime.base import RuntimeFailure

log = logging.getLogger(__name__)


class Volumes:
    def __init__(self, work_root: str | os.PathLike):
        self.dir = Path(work_root) / "volumes"
        self._lock = threading.Lock()  # one make/mount/remove at a time: jobs may share one
        self._reported: list[dict] | None = None  # the last report's volumes (None: none yet)

    def mount_point(self, volume_id: int) -> Path:
        return self.dir / str(int(volume_id))

    def image(self, volume_id: int) -> Path:
        return disks.image_of(self.mount_point(volume_id))

    def _mounted(self) -> set[Path]:
        return set(disks.mounted_below(self.dir)) if self.dir.is_dir() else set()

    def ensure(self, volume_id: int, size_mib: int) -> Path:
        """The volume's filesystem, mounted (made first when this node never held it); the
        folder the job's container gets."""
        problem = disks.enforcement_problem()
        if problem:
            raise disks.unenforceable(problem)
        point = self.mount_point(volume_id)
        with self._lock:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if point in self._mounted():
                return point
            if self.image(volume_id).exists():
                point.mkdir(mode=0o755, exist_ok=True)
                disks._run(
                    "mount", "-o", "loop,nosuid,nodev", str(self.image(volume_id)), str(point)
                )
                log.info("volume %s mounted again", volume_id)
                return point
            if size_mib <= 0:
                raise RuntimeFailure("runtime_error", f"volume {volume_id} has no size")
            try:
                disks.make(point, size_mib)
            except BaseException:
                self._remove(volume_id)
                raise
            log.info("volume %s made: %s MiB", volume_id, size_mib)
            return point

    def held(self) -> list[dict]:
        """`[{"id", "used_bytes"}]` of every volume image here: a mounted one's used blocks, an
        unmounted one's bytes on the node's disk."""
        if not self.dir.is_dir():
            return []
        mounted = self._mounted()
        held = []
        for image in sorted(self.dir.glob("*.img")):
            stem = image.name.removesuffix(".img")
            if not stem.isdigit():
                continue
            point = self.mount_point(int(stem))
            try:
                if point in mounted:
                    stat = os.statvfs(point)
                    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
                else:
                    used = image.stat().st_blocks * 512
            except OSError:
                continue
            held.append({"id": int(stem), "used_bytes": int(used)})
        return held

    def remove(self, volume_id: int) -> None:
        """The volume's filesystem unmounted (lazily when a container still holds it) and its
        image deleted: the control plane said it is deleted or expired."""
        with self._lock:
            self._remove(volume_id)
        log.info("volume %s removed", volume_id)

    def _remove(self, volume_id: int) -> None:
        point = self.mount_point(volume_id)
        if point in self._mounted():
            disks.release(point)  # unmounts it and deletes the image beside it
        self.image(volume_id).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            point.rmdir()

    def reconcile(self, client) -> list[int]:
        """Reports what is held here; removes what the control plane says is gone. The ids
        removed. Nothing is sent while nothing is held and the last report (since this agent
        started) held nothing either: an image removed is reported gone once, which gives its
        disk back; a volume never mounted here has no image, and the control plane returns its
        disk when it is deleted."""
        held = self.held()
        if not held and self._reported == []:
            return []
        answer = client.volumes(held) or {}
        self._reported = held
        removed = []
        for volume_id in answer.get("remove") or ():
            try:
                self.remove(int(volume_id))
                removed.append(int(volume_id))
            except (RuntimeFailure, OSError, ValueError) as exc:
                log.warning("volume %s not removed: %s", volume_id, exc)
        return removed
