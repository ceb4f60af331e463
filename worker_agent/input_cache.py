"""The node's input cache (docs/storage.md, "Data locality"): inputs the agent downloaded, kept
by object under the agent's state directory, so that the next attempt asking for the same object
on this node gets it without the bytes crossing the network again.

- Keyed by the object: an input's URL without its fragment; a presigned one (`presigned: true`,
  the control plane's GET of an object-store object) without its query too, since the signature
  changes with every lease while the object does not (`key_for`). The control plane computes
  the same key for the scheduler (`data_locality`).
- Never served blind: an entry is stored only when the server gave a validator (ETag or
  Last-Modified) and did not say `no-store`, and a hit is a conditional GET made exactly as the
  download would be (the job's URL, its network namespace, its address rules, its signature):
  304 fills inputs/ from the cache; anything else is downloaded as if there were no entry. So a
  job gets only what its own request may fetch, and never a stale object; what moves for a hit
  is one request and its headers.
- A job sees only its own inputs: an entry is linked (or copied) into the attempt's inputs/, a
  file of root's, mode 0444, on a read-only mount; the cache directory is never mounted.
  Hard links only where jobs never run as the agent's user (no process runtime on the node):
  there a job could write through the link into the cache.
- Bounded: at most `max_bytes` and `max_entries`, least recently used evicted first.

Thread-safe (one lock over the index; each attempt's fetch runs in a thread of its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 20 * 1024**3
DEFAULT_MAX_ENTRIES = 1024  # the heartbeat's bound (worker_agent/schemas/storage-v1.json)
REPORT_MAX = 1024
KEY_MAX = 2048
DOWNLOADS_MAX = 64  # measurements kept between two heartbeats


def key_for(url: str, *, presigned: bool = False) -> str:
    """The cache key of an input: its URL without fragment (and, presigned, without query)."""
    parts = urlsplit(url)
    query = "" if presigned else parts.query
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, query, ""))


@dataclass(frozen=True)
class Entry:
    key: str
    path: Path  # the data file
    bytes: int
    etag: str = ""
    last_modified: str = ""

    def validators(self) -> dict[str, str]:
        """The conditional request's headers."""
        headers = {}
        if self.etag:
            headers["If-None-Match"] = self.etag
        if self.last_modified:
            headers["If-Modified-Since"] = self.last_modified
        return headers


def cacheable(headers) -> dict | None:
    """The validators of a 200 response worth keeping ({"etag", "last_modified"}), None when
    the server forbids storing it or gave no way to revalidate it."""
    control = (headers.get("Cache-Control") or "").lower()
    if "no-store" in control or "private" in control:
        return None
    etag, modified = headers.get("ETag") or "", headers.get("Last-Modified") or ""
    if not (etag or modified) or len(etag) > 256 or len(modified) > 64:
        return None
    return {"etag": etag, "last_modified": modified}


class InputCache:
    def __init__(
        self,
        root: str | os.PathLike,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        link: bool = True,
    ):
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.max_bytes, self.max_entries, self.link = max_bytes, max_entries, link
        self.lock = threading.Lock()
        self.downloads: deque[dict] = deque(maxlen=DOWNLOADS_MAX)
        self.index: dict[str, dict] = {}  # key → {"dir", "bytes", "etag", "last_modified", "used"}
        self._load()

    # ------------------------------------------------------------------ the index
    def _dir(self, key: str) -> Path:
        return self.root / hashlib.sha256(key.encode()).hexdigest()

    def _load(self) -> None:
        """The entries a previous agent left; half-written ones removed."""
        for folder in self.root.iterdir():
            meta = folder / "meta.json"
            try:
                data = json.loads(meta.read_text())
                ok = (
                    folder.name == hashlib.sha256(data["key"].encode()).hexdigest()
                    and (folder / "data").stat().st_size == data["bytes"]
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                ok = False
            if not ok:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            self.index[data["key"]] = data | {"dir": str(folder)}
        self._evict()

    def lookup(self, key: str) -> Entry | None:
        with self.lock:
            data = self.index.get(key)
            if data is None:
                return None
            path = Path(data["dir"]) / "data"
            if not path.is_file():
                self.index.pop(key, None)
                return None
            return Entry(key, path, data["bytes"], data["etag"], data["last_modified"])

    # ------------------------------------------------------------------ use and fill
    def fill(self, entry: Entry, target: Path) -> None:
        """The entry into the attempt's `target` (which must not exist): a hard link where
        allowed and possible, a copy otherwise."""
        if self.link:
            try:
                os.link(entry.path, target)
                self._touch(entry.key)
                return
            except OSError:
                pass  # another filesystem, a link limit: a copy will do
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(entry.path, "rb") as source, os.fdopen(fd, "wb") as copy:
            shutil.copyfileobj(source, copy, 1024 * 1024)
        os.chmod(target, 0o444)
        self._touch(entry.key)

    def _touch(self, key: str) -> None:
        with self.lock:
            if key in self.index:
                self.index[key]["used"] = time.time()

    def store(self, key: str, source: Path, validators: dict) -> None:
        """`source` (an attempt's input the agent just downloaded) kept as the entry of `key`."""
        if len(key) > KEY_MAX:
            return
        size = source.stat().st_size
        if size > self.max_bytes:
            return
        folder = self._dir(key)
        staging = self.root / f".new-{folder.name}-{threading.get_ident()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        try:
            data = staging / "data"
            linked = False
            if self.link:
                with contextlib.suppress(OSError):
                    os.link(source, data)
                    linked = True
            if not linked:
                shutil.copyfile(source, data)
            os.chmod(data, 0o444)
            meta = {"key": key, "bytes": size, "used": time.time(), **validators}
            (staging / "meta.json").write_text(json.dumps(meta))
            with self.lock:
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(staging, folder)
                self.index[key] = meta | {"dir": str(folder)}
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._evict()

    def forget(self, key: str) -> None:
        with self.lock:
            data = self.index.pop(key, None)
        if data is not None:
            shutil.rmtree(data["dir"], ignore_errors=True)

    def _evict(self) -> None:
        with self.lock:
            order = sorted(self.index.items(), key=lambda item: item[1].get("used", 0))
            total = sum(data["bytes"] for _, data in order)
            gone = []
            while order and (total > self.max_bytes or len(order) > self.max_entries):
                key, data = order.pop(0)
                total -= data["bytes"]
                gone.append(data["dir"])
                del self.index[key]
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ the heartbeat's report
    def record_download(self, key: str, size: int, seconds: float) -> None:
        if len(key) <= KEY_MAX:
            self.downloads.append({"key": key, "bytes": int(size), "seconds": round(seconds, 3)})

    def take_downloads(self) -> list[dict]:
        """The downloads measured since the last call (sent with the heartbeat)."""
        taken = []
        while self.downloads:
            taken.append(self.downloads.popleft())
        return taken

    def report(self) -> list[dict]:
        """[{"key", "bytes"}], the most recently used first, at most REPORT_MAX."""
        with self.lock:
            entries = sorted(self.index.items(), key=lambda item: -item[1].get("used", 0))
        return [{"key": key, "bytes": data["bytes"]} for key, data in entries[:REPORT_MAX]]


# The agent's cache (None: no cache, every input downloaded): set once at start (`configure`).
_CACHE: InputCache | None = None


def configure(root, **options) -> InputCache:
    global _CACHE
    _CACHE = InputCache(root, **options)
    return _CACHE


def active() -> InputCache | None:
    return _CACHE
