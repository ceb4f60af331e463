"""A job's checkpoint as it travels between attempts (docs/data-plane.md, "Checkpoints").

Packing: the regular files below the attempt's outputs/checkpoint/ ($CHECKPOINT_DIR), as one
plain tar with paths `checkpoint/…`, never following a link the job made. Restoring: the next
attempt downloads the newest earlier checkpoint from its own API (with its node credential),
checks its sha256 against the assignment's, and unpacks it into its own empty
outputs/checkpoint/ before the job starts. The archive came from a job's directory, so it is
unpacked as untrusted: regular files only, relative paths under `checkpoint/` without `.`,
`..` or empty parts, no links, devices or special modes, each file created anew (never
through an existing path), within a total size and a number of files.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
from pathlib import Path

from worker_agent.client import ApiError, ApiUnreachable
from worker_agent.runtime.base import CHECKPOINT_SUBDIR, RuntimeFailure

log = logging.getLogger(__name__)

ARCHIVE = "checkpoint.tar"  # its name among the outputs
RESTORE_MAX_BYTES = 16 * 1024**3  # the download, and the files unpacked from it
RESTORE_MAX_FILES = 100_000
NOBODY = 65534  # the containers' user: it must be able to rewrite what it saved


def pack(root: Path, target: Path) -> bool:
    """Writes the regular files below `root` into the tar `target` as `<root name>/…`; False
    (and no file) when there are none."""
    members = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            handle = os.fdopen(fd, "rb")
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                handle.close()
                continue
            members.append((os.path.relpath(path, root.parent), info, handle))
    if not members:
        return False
    with tarfile.open(target, "w") as tar:
        for arcname, info, handle in members:
            entry = tarfile.TarInfo(arcname)
            entry.size, entry.mtime, entry.mode = info.st_size, int(info.st_mtime), 0o644
            with handle:
                tar.addfile(entry, handle)
    return True


def restore(client, assignment, workdir: Path) -> int:
    """Downloads the assignment's checkpoint, verifies it and unpacks it into
    workdir/outputs/checkpoint/; how many files it restored. A checkpoint that cannot be had
    or does not verify fails the attempt (runtime_error): the job must not start without the
    state it was promised."""
    archive = workdir / "restore.tar"  # beside outputs/, out of the job's reach
    try:
        digest = client.checkpoint(assignment.job, archive, RESTORE_MAX_BYTES)
        if digest != assignment.restore["sha256"]:
            raise RuntimeFailure(
                "runtime_error",
                f"the checkpoint's sha256 is {digest[:12]}…, not the assignment's "
                f"{assignment.restore['sha256'][:12]}…",
            )
        return unpack(archive, workdir / "outputs" / CHECKPOINT_SUBDIR)
    except (ApiError, ApiUnreachable) as exc:
        raise RuntimeFailure("runtime_error", f"checkpoint not downloaded: {exc}") from exc
    finally:
        archive.unlink(missing_ok=True)


def safe_parts(name: str) -> list[str] | None:
    """The path below checkpoint/ of a member name, or None when it may not be unpacked."""
    parts = name.split("/")
    if len(parts) < 2 or parts[0] != CHECKPOINT_SUBDIR or "\x00" in name:
        return None
    if any(part in ("", ".", "..") for part in parts[1:]):
        return None
    return parts[1:]


def unpack(archive: Path, root: Path) -> int:
    """The regular files of `archive` under `checkpoint/` into the (empty) folder `root`;
    everything else is skipped with a warning. Returns how many files it wrote."""
    written, size = 0, 0
    try:
        with tarfile.open(archive, "r:") as tar:  # plain tar, as packed
            for member in tar:
                parts = safe_parts(member.name)
                if parts is None or not member.isreg():
                    log.warning(
                        "checkpoint member %r skipped (not a plain file)", member.name[:200]
                    )
                    continue
                size += member.size
                if written >= RESTORE_MAX_FILES or size > RESTORE_MAX_BYTES:
                    raise RuntimeFailure("runtime_error", "the checkpoint is too large to restore")
                folder = _folders(root, parts[:-1])
                if folder is None:
                    continue
                try:  # created anew: never through a file or link already there
                    fd = os.open(
                        folder / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    )
                except OSError as exc:
                    log.warning("checkpoint member %r skipped: %s", member.name[:200], exc)
                    continue
                with os.fdopen(fd, "wb") as out, tar.extractfile(member) as data:
                    shutil.copyfileobj(data, out, 1024 * 1024)
                _own(folder / parts[-1], directory=False)
                written += 1
    except tarfile.TarError as exc:
        raise RuntimeFailure("runtime_error", f"the checkpoint is not a tar: {exc}") from exc
    return written


def _folders(root: Path, parts: list[str]) -> Path | None:
    """root/parts…, each folder made by us (or already a real folder, not a link)."""
    folder = root
    for part in parts:
        folder = folder / part
        try:
            os.mkdir(folder)
            _own(folder, directory=True)
        except FileExistsError:
            pass
        if folder.is_symlink() or not folder.is_dir():
            log.warning("checkpoint folder %s skipped (not a folder)", folder)
            return None
    return folder


def _own(path: Path, *, directory: bool) -> None:
    """As outputs/ itself: the job's user (nobody in a container) may rewrite its state."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        os.chmod(path, 0o755 if directory else 0o644)
    else:
        os.chmod(path, 0o777 if directory else 0o666)
