"""What a job left in /outputs, read through the container boundary and streamed to the
control plane (docs/data-plane.md, "Outputs and checkpoints").

The agent never opens a job's files by host path. It reads the runtime's tar archive of the
stopped container's /outputs (the engine's archive API: the engine resolves paths in the
container's own filesystem, so a link the job made points into the container, never at the
node), member by member, and streams each top-level regular file as its own upload. The
regular files below /outputs/checkpoint travel as one output, checkpoint.tar (paths
`checkpoint/…`), written as a stream from a second read of that folder. Nothing is written to
the node's disk on the way. Every other kind of member (links, hard links, FIFOs, devices,
folders) is skipped, and each skip is reported with the final report (`outputs_skipped`):
the control plane records them in the job's events.
"""

from __future__ import annotations

import hashlib
import logging
import re
import tarfile
from dataclasses import dataclass, field

from worker_agent import presigned, tarstream
from worker_agent.client import ApiError
from worker_agent.runtime.base import CHECKPOINT_SUBDIR
from worker_agent.runtime.protocol import Runtime

log = logging.getLogger(__name__)

OUTPUTS = "/outputs"
CHECKPOINT_ARCHIVE = "checkpoint.tar"  # the checkpoint's name among the outputs (reserved)
OUTPUT_FILES_MAX = 256
OUTPUT_FILE_MAX_BYTES = 1024**3  # the control plane's default JOB_OUTPUT_MAX_BYTES
CHECKPOINT_FILES_MAX = 100_000
READ_MAX_BYTES = 16 * 1024**3  # of the archive, skipped data included (sparse files!)
READ_SLACK_BYTES = 64 * 1024**2


def read_budget(output_limit_mib: int) -> int:
    """How much of an archive is read: what the job's /outputs filesystem can hold and a
    little more (a sparse file's holes read as zeros), READ_MAX_BYTES without a limit."""
    if output_limit_mib <= 0:
        return READ_MAX_BYTES
    return min(READ_MAX_BYTES, output_limit_mib * 1024**2 + READ_SLACK_BYTES)


SKIPPED_MAX = 100  # entries listed in the report; the total counts them all
NAME_MAX_CHARS = 255
KINDS = {
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.FIFOTYPE: "fifo",
    tarfile.CHRTYPE: "device",
    tarfile.BLKTYPE: "device",
    tarfile.DIRTYPE: "directory",
}
# Why a member was not uploaded (docs/data-plane.md lists them; jobs/api/agent.py accepts them)
SKIP_REASONS = (
    "symlink",
    "hardlink",
    "fifo",
    "device",
    "directory",
    "other",  # any other kind of member
    "name",  # not a plain file name (a '/', '\', '..', a control character, not UTF-8, too long)
    "reserved",  # a file of the job named checkpoint.tar
    "too_large",  # above OUTPUT_FILE_MAX_BYTES (the checkpoint: its whole archive)
    "too_many",  # beyond OUTPUT_FILES_MAX (CHECKPOINT_FILES_MAX in the checkpoint)
    "read_limit",  # the archive ran past READ_MAX_BYTES: it and what follows were not read
    "refused",  # the control plane refused the upload (400/409/413)
    "failed",  # reading or sending it failed
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def plain_name(name: str) -> bool:
    """A name the control plane takes as an output's (pools.validation.file_name)."""
    try:
        name.encode()
    except UnicodeEncodeError:  # not UTF-8 on the node's disk
        return False
    return (
        0 < len(name) <= NAME_MAX_CHARS
        and not any(c in name for c in "/\\")
        and ".." not in name
        and name != "."
        and not _CONTROL.search(name)
    )


def printable(name: str) -> str:
    """A member's name as it can be reported (UTF-8, no control characters, ≤ 255)."""
    text = name.encode("utf-8", "backslashreplace").decode()
    return _CONTROL.sub("?", text)[:NAME_MAX_CHARS]


def kind_of(member: tarfile.TarInfo) -> str:
    return KINDS.get(member.type, "other")


@dataclass
class Outputs:
    """One attempt's upload of its outputs, from the runtime's archive of `handle`."""

    runtime: Runtime
    handle: object
    client: object
    job: int
    fencing_token: str
    read_max: int = READ_MAX_BYTES
    uploaded: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    skipped_total: int = 0
    checkpoint: dict[str, tuple[int, int]] = field(default_factory=dict)  # name → size, mtime
    read: int = 0
    # the assignment's `output_store` ({"kind": "s3", "location"}: each file PUT by a presigned
    # URL, docs/storage.md) and the object-store origins it may reach (pool_network's)
    store: dict | None = None
    store_endpoints: tuple[str, ...] = ()
    pending: list[tuple[str, int, str]] = field(default_factory=list)  # name, size, sha256

    def skip(self, name: str, reason: str) -> None:
        log.warning("job %s: output %r skipped (%s)", self.job, name[:200], reason)
        self.skipped_total += 1
        if len(self.skipped) < SKIPPED_MAX:
            self.skipped.append({"name": printable(name), "reason": reason})

    def report(self) -> dict:
        """The final report's fields for what was skipped (none when nothing was)."""
        if not self.skipped_total:
            return {}
        return {"outputs_skipped": self.skipped, "outputs_skipped_total": self.skipped_total}

    # ------------------------------------------------------------------ the pass
    def upload(self) -> None:
        """Every top-level regular file, then the checkpoint; ApiError/ApiUnreachable other
        than a refused file stop it (the runner logs them)."""
        stream = self.runtime.archive(self.handle, OUTPUTS)
        if stream is None:
            return
        with stream:
            self._members(tarstream.open_stream(stream))
        for name, size, sha256 in self.pending:
            if self.store:
                self._upload_object(name, size, sha256)
            else:
                reread = lambda name=name, size=size: self._reread(name, size)  # noqa: E731
                self._upload(name, size, reread(), reread=reread, sha256=sha256)
        if self.checkpoint:
            self._upload_checkpoint()

    def _members(self, tar: tarfile.TarFile) -> None:
        checkpoint_folder = False
        for member in tar:
            _root, _, path = member.name.partition("/")  # outputs/<path>
            if not path.strip("/"):
                continue
            path = path.rstrip("/")
            if member.isreg() and self.read + member.size > self.read_max:
                self.skip(path, "read_limit")  # not read: neither it nor what follows
                return
            self.read += member.size if member.isreg() else 0
            top, _, below = path.partition("/")
            if top == CHECKPOINT_SUBDIR:
                if not below:
                    checkpoint_folder = member.isdir()
                    if not checkpoint_folder:  # e.g. a link put in place of the folder
                        self.skip(path, kind_of(member))
                elif checkpoint_folder:
                    self._checkpoint_member(path, member)
                continue
            if below:
                continue  # inside a folder: the folder itself was recorded
            if not member.isreg():
                self.skip(path, kind_of(member))
            elif not plain_name(path):
                self.skip(path, "name")
            elif path == CHECKPOINT_ARCHIVE:
                self.skip(path, "reserved")
            elif len(self.uploaded) + len(self.pending) >= OUTPUT_FILES_MAX:
                self.skip(path, "too_many")
            elif member.size > OUTPUT_FILE_MAX_BYTES:
                self.skip(path, "too_large")
            else:  # hashed now (the upload is signed over it), sent after this read: one
                # archive stream at a time (a second one during the first hangs the engine)
                self.pending.append((path, member.size, _sha256(tarstream.data_of(tar, member))))

    def _upload(self, name: str, size: int, data, *, reread, sha256: str | None = None) -> None:
        """`data` (an iterator of chunks) as the output `name`, whose SHA-256 is `sha256` (None:
        the client reads it once ahead); a retry sends `reread()`."""
        first = [data]

        def opener():
            return first.pop() if first else reread()

        try:
            self.client.output(self.job, self.fencing_token, name, size, opener, sha256=sha256)
        except ApiError as exc:
            if exc.status not in (400, 409, 413):
                raise
            self.skip(name, "refused")
            return
        except (OSError, tarfile.TarError) as exc:
            log.warning("job %s: output %s: %s", self.job, name, exc)
            self.skip(name, "failed")
            return
        self.uploaded.append(name)

    def _upload_object(self, name: str, size: int, sha256: str) -> None:
        """One output to the job's s3:// destination, its sha256 taken in the first read: a
        presigned PUT (from the control plane: this file's key, size and digest signed in) fed
        by a second read of the file, then the control plane records it after a HEAD. Nothing
        is written to the node's disk; the checkpoint still goes to the control plane."""
        for attempt in (1, 2):  # a failed PUT is tried once more, with a fresh URL
            try:
                signed = self.client.output_presign(
                    self.job, self.fencing_token, name, size, sha256
                )
                presigned.put(
                    str(signed.get("url", "")),
                    dict(signed.get("headers") or {}),
                    size,
                    self._reread(name, size),
                    endpoints=self.store_endpoints,
                )
                self.client.output_record(self.job, self.fencing_token, name, size, sha256)
            except ApiError as exc:
                if exc.status not in (400, 409, 413):
                    raise
                log.warning("job %s: output %s refused: %s", self.job, name, exc.code or exc)
                self.skip(name, "refused")
                return
            except presigned.PutRefused as exc:
                log.warning("job %s: output %s: %s", self.job, name, exc)
                if attempt == 2 or "no registered" in str(exc):
                    self.skip(name, "refused")
                    return
                continue
            except (OSError, tarfile.TarError) as exc:
                log.warning("job %s: output %s: %s", self.job, name, exc)
                if attempt == 2:
                    self.skip(name, "failed")
                    return
                continue
            self.uploaded.append(name)
            return

    def _reread(self, name: str, size: int):
        stream = self.runtime.archive(self.handle, f"{OUTPUTS}/{name}")
        if stream is None:
            raise OSError(f"{name} is gone")
        with stream:
            tar = tarstream.open_stream(stream)
            member = tar.next()
            if member is None or not member.isreg() or member.size != size:
                raise OSError(f"{name} is no longer the regular file of {size} bytes")
            yield from tarstream.data_of(tar, member)

    # ------------------------------------------------------------------ the checkpoint
    def _checkpoint_member(self, path: str, member: tarfile.TarInfo) -> None:
        if member.isdir():
            return
        if not member.isreg():
            self.skip(path, kind_of(member))
        elif "\x00" in path or not _utf8(path):
            self.skip(path, "name")
        elif len(self.checkpoint) >= CHECKPOINT_FILES_MAX:
            self.skip(path, "too_many")
        else:
            self.checkpoint[path] = (member.size, int(member.mtime))

    def _upload_checkpoint(self) -> None:
        """checkpoint.tar: its headers made from the first read, its data streamed from a
        second read of /outputs/checkpoint (the container is stopped: the same files)."""
        heads = {
            name: tarstream.header(name, size=size, mtime=mtime)
            for name, (size, mtime) in self.checkpoint.items()
        }
        size = len(tarstream.END) + sum(
            tarstream.member_length(heads[name], size)
            for name, (size, _) in self.checkpoint.items()
        )
        if size > OUTPUT_FILE_MAX_BYTES:
            self.skip(CHECKPOINT_ARCHIVE, "too_large")
            return

        def opener():
            stream = self.runtime.archive(self.handle, f"{OUTPUTS}/{CHECKPOINT_SUBDIR}")
            if stream is None:
                raise OSError("the checkpoint folder is gone")
            left = dict(self.checkpoint)
            with stream:
                tar = tarstream.open_stream(stream)
                for member in tar:
                    expected = left.pop(member.name, None) if member.isreg() else None
                    if expected is None:
                        continue
                    if member.size != expected[0]:
                        raise OSError(f"{member.name} changed size")
                    yield heads[member.name]
                    yield from tarstream.data_of(tar, member)
                    yield tarstream.padding(member.size)
            if left:
                raise OSError(f"{len(left)} checkpoint files are gone")
            yield tarstream.END

        self._upload(CHECKPOINT_ARCHIVE, size, opener(), reread=opener)


def _sha256(chunks) -> str:
    digest = hashlib.sha256()
    for block in chunks:
        digest.update(block)
    return digest.hexdigest()


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
