"""A job's checkpoint as it travels between attempts (docs/data-plane.md, "Checkpoints").

Packing is part of the outputs' upload (worker_agent/outputs.py): the regular files below
/outputs/checkpoint ($CHECKPOINT_DIR), read through the runtime's archive of the stopped
container, streamed as one plain tar `checkpoint.tar` with paths `checkpoint/…`.

Restoring: the next attempt streams the newest earlier checkpoint from its own API (with its
node credential) straight into its created, not yet started container, through the runtime's
`unpack` of /outputs (the engine's archive API under Docker): never through a path on the node.
The archive came from a job, so it is rewritten on the way as untrusted: regular files only,
relative paths under `checkpoint/` without `.`, `..` or empty parts, each folder and file owned
by the job's user (0755 / 0644), within a total size and a number of files. Its sha256 is
checked against the assignment's when the download ends; a mismatch fails the attempt before the
container starts (and the container, with whatever was unpacked into it, is removed).
"""

from __future__ import annotations

import logging
import tarfile

from worker_agent import tarstream
from worker_agent.client import ApiError, ApiUnreachable
from worker_agent.outputs import CHECKPOINT_ARCHIVE, OUTPUTS
from worker_agent.runtime.base import CHECKPOINT_SUBDIR, JOB_USER_ID, RuntimeFailure
from worker_agent.runtime.protocol import Runtime

log = logging.getLogger(__name__)

ARCHIVE = CHECKPOINT_ARCHIVE
RESTORE_MAX_BYTES = 16 * 1024**3  # the download, and the files unpacked from it
RESTORE_MAX_FILES = 100_000


def safe_parts(name: str) -> list[str] | None:
    """The path below checkpoint/ of a member name, or None when it may not be unpacked."""
    parts = name.split("/")
    if len(parts) < 2 or parts[0] != CHECKPOINT_SUBDIR or "\x00" in name:
        return None
    if any(part in ("", ".", "..") for part in parts[1:]):
        return None
    return parts[1:]


def restore(client, assignment, runtime: Runtime, handle) -> int:
    """Streams the assignment's checkpoint into the created container's /outputs/checkpoint;
    how many files it restored. A checkpoint that cannot be had or does not verify fails the
    attempt (runtime_error): the job must not start without the state it was promised."""
    restored = Restored(assignment.restore["sha256"])
    try:
        with client.checkpoint(assignment.job, RESTORE_MAX_BYTES) as download:
            runtime.unpack(handle, OUTPUTS, restored.tar(download))
    except (ApiError, ApiUnreachable) as exc:
        raise RuntimeFailure("runtime_error", f"checkpoint not downloaded: {exc}") from exc
    if restored.error is not None:  # raised inside the stream: the engine may have hidden it
        raise restored.error
    return restored.files


class Restored:
    """The tar the runtime unpacks: the download's plain files, rewritten as the job's."""

    def __init__(self, sha256: str):
        self.sha256, self.files, self.error = sha256, 0, None

    def tar(self, download):
        try:
            yield from self._members(download)
        except RuntimeFailure as exc:
            self.error = exc
            raise
        except (OSError, tarfile.TarError) as exc:
            self.error = RuntimeFailure("runtime_error", f"the checkpoint is not a tar: {exc}")
            raise self.error from exc

    def _members(self, download):
        owner = {"uid": JOB_USER_ID}
        folders = {CHECKPOINT_SUBDIR}
        yield tarstream.header(CHECKPOINT_SUBDIR, kind=tarfile.DIRTYPE, **owner)
        chunks = download.chunks()
        tar = tarstream.open_stream(tarstream.reader(chunks))
        for member in tar:
            parts = safe_parts(member.name)
            if parts is None or not member.isreg():
                log.warning("checkpoint member %r skipped (not a plain file)", member.name[:200])
                continue
            if self.files >= RESTORE_MAX_FILES:
                raise RuntimeFailure("runtime_error", "the checkpoint is too large to restore")
            for depth in range(1, len(parts)):
                folder = "/".join([CHECKPOINT_SUBDIR, *parts[:depth]])
                if folder not in folders:
                    folders.add(folder)
                    yield tarstream.header(folder, kind=tarfile.DIRTYPE, **owner)
            name = "/".join([CHECKPOINT_SUBDIR, *parts])
            yield tarstream.header(name, size=member.size, mtime=member.mtime, **owner)
            yield from tarstream.data_of(tar, member)
            yield tarstream.padding(member.size)
            self.files += 1
        for _ in chunks:  # the rest of the download, for its digest
            pass
        if download.sha256 != self.sha256:
            raise RuntimeFailure(
                "runtime_error",
                f"the checkpoint's sha256 is {download.sha256[:12]}…, not the assignment's "
                f"{self.sha256[:12]}…",
            )
        yield tarstream.END
