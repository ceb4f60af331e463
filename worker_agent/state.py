"""The agent's state directory: its node credential (mode 0600) and who it is (node id, name,
the control plane's id: the owner of its containers, runtime.base.Owner).

Files are replaced atomically (write a temporary file created with mode 0600, fsync, rename), so
a crash never leaves half a credential and a reader never sees one. The directory itself is
0700, and it holds nothing of any job: attempts live below the work root
(worker_agent/workroot.py), which never contains it.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

from worker_agent.runtime.base import Owner

STATE_FILE = "agent.json"  # node and control-plane ids, credential prefix and expiry: not secret
CREDENTIAL_FILE = "credential"  # the node credential itself: 0600, nothing else in it
LOCK_FILE = "agent.lock"  # held (flock) by the one agent process using this state dir


class StateInUse(Exception):
    """Another agent process holds this state dir."""


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically with mode 0600 (never readable by others, not even
    for an instant: the file is created with that mode, not chmod-ed afterwards)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may only remove bits; be explicit anyway
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def parse_time(value) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class AgentState:
    """What the agent keeps across restarts, under `directory`."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._lock = threading.Lock()
        self._held = None  # the open lock file while this process holds the dir

    # ---------------------------------------------------------------- one agent per dir
    def hold(self) -> None:
        """Take the state dir for this process (released when it exits): two agents on one
        credential would be one node running two sets of containers."""
        lock = open(self.dir / LOCK_FILE, "a")  # noqa: SIM115 (kept open: the lock is the fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StateInUse(f"another agent is running with the state dir {self.dir}") from None
        self._held = lock

    @staticmethod
    def in_use(directory: str | os.PathLike) -> bool:
        """Whether an agent process holds `directory` now."""
        try:
            with open(Path(directory) / LOCK_FILE) as lock:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except FileNotFoundError:
            return False
        except BlockingIOError:
            return True
        return False

    # ---------------------------------------------------------------- the credential
    def credential(self) -> str | None:
        """The node credential as stored now (re-read from disk each time: a rotation by
        another thread or an operator's replacement of the file is picked up)."""
        try:
            secret = (self.dir / CREDENTIAL_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return secret or None

    def save_credential(self, body: dict) -> None:
        """Store a credential from an enrollment or rotation answer ({credential, _prefix,
        _expires_at}); the secret goes to its own 0600 file, the rest to agent.json."""
        with self._lock:
            write_private(self.dir / CREDENTIAL_FILE, body["credential"].encode())
            self._update(
                credential_prefix=body.get("credential_prefix", ""),
                credential_expires_at=str(body.get("credential_expires_at") or ""),
                credential_issued_at=datetime.now(UTC).isoformat(),
            )

    def credential_due_for_rotation(self, now: datetime | None = None) -> bool:
        """True once half of the credential's lifetime has passed (rotation keeps a short
        overlap on the server, so rotating early is harmless and expiring is not)."""
        info = self.info()
        expires = parse_time(info.get("credential_expires_at"))
        issued = parse_time(info.get("credential_issued_at"))
        if expires is None or issued is None:
            return False
        now = now or datetime.now(UTC)
        return now >= issued + (expires - issued) / 2

    # ---------------------------------------------------------------- who we are
    def info(self) -> dict:
        try:
            return json.loads((self.dir / STATE_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def save_node(self, node: dict, control_plane: str | None = None) -> None:
        values = {"node_id": node.get("id"), "node_name": node.get("name", "")}
        if control_plane:
            values["control_plane"] = str(control_plane)
        with self._lock:
            self._update(**values)

    def owner(self) -> Owner | None:
        """Who this agent's containers belong to; None before enrollment."""
        info = self.info()
        try:
            return Owner(info["control_plane"], info["node_id"], info.get("node_name") or "")
        except (KeyError, TypeError, ValueError):
            return None

    def _update(self, **values) -> None:
        info = self.info() | values
        write_private(self.dir / STATE_FILE, json.dumps(info, indent=2).encode())
