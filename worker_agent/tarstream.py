"""Tar archives as streams, never as files on the node: what the engine's archive API hands
out is read member by member, and what the agent sends (checkpoint.tar, a restore) is written
as it goes, with its length known up front where an upload needs one."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE
CHUNK = 1024 * 1024
END = b"\0" * (2 * BLOCK)  # the end-of-archive marker


class ChunkReader(io.RawIOBase):
    """A readable binary file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks):
        self._source = chunks
        self._start(iter(chunks))

    def _start(self, chunks) -> None:
        self._chunks = chunks
        self._buffer, self._offset, self._position = b"", 0, 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def readinto(self, target) -> int:
        while self._offset >= len(self._buffer):
            self._buffer, self._offset = next(self._chunks, None), 0
            if self._buffer is None:
                self._buffer = b""
                return 0
        size = min(len(target), len(self._buffer) - self._offset)
        target[:size] = memoryview(self._buffer)[self._offset : self._offset + size]
        self._offset += size
        self._position += size
        return size

    def close(self) -> None:
        closer = getattr(self._source, "close", None)
        if closer is not None:
            closer()
        super().close()


def reader(chunks) -> io.BufferedReader:
    return io.BufferedReader(ChunkReader(chunks), CHUNK)


def open_stream(fileobj) -> tarfile.TarFile:
    """A tar read strictly in order (`r|`): nothing is seeked, nothing kept."""
    return tarfile.open(fileobj=fileobj, mode="r|")


def data_of(tar: tarfile.TarFile, member: tarfile.TarInfo):
    """The member's data in chunks, exactly `member.size` bytes (or OSError)."""
    source, left = tar.extractfile(member), member.size
    while left:
        block = source.read(min(CHUNK, left))
        if not block:
            raise OSError(f"{member.name}: the archive ended inside the file")
        left -= len(block)
        yield block


def header(name: str, *, size: int = 0, mtime: int = 0, kind=tarfile.REGTYPE, **owner) -> bytes:
    """One member's header block(s) (PAX for long names), mode 0644 (0755 for a folder)."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, max(0, int(mtime))
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.uid = info.gid = int(owner.get("uid", 0))
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def member_length(head: bytes, size: int) -> int:
    return len(head) + size + (-size % BLOCK)


def extract_plain(fileobj, root: Path) -> int:
    """Unpacks the folders and regular files of a tar stream below the folder `root` (the
    process runtime's put_archive; the engine does this for containers). Each folder is made
    here or is a real folder already, each file created anew (never through a link or a file
    already there); links and every other kind are skipped. How many files it wrote."""
    written = 0
    tar = open_stream(fileobj)
    for member in tar:
        parts = member.name.split("/")
        if member.name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            continue
        if not (member.isdir() or member.isreg()):
            continue
        folder = _folder(root, parts if member.isdir() else parts[:-1])
        if folder is None or member.isdir():
            continue
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(folder / parts[-1], flags, 0o644), "wb") as out:
            for block in data_of(tar, member):
                out.write(block)
        written += 1
    return written


def _folder(root: Path, parts: list[str]) -> Path | None:
    """root/parts…, each made here or already a real folder (not a link); None otherwise."""
    folder = root
    for part in parts:
        folder = folder / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755)
        if folder.is_symlink() or not folder.is_dir():
            return None
    return folder
