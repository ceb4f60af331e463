"""A job's secrets as files, never as environment variables (docs/data-plane.md, "Secrets").

The assignment maps NAME → value. The job finds each value in the file `<dir>/NAME` (mode 0400,
owned by the job's user) and the variable `NAME_FILE` names that file; `<dir>` is
`/run/secrets` in a container. The values are never in the container's environment or its
configuration (`docker inspect`), and never on the node's disk:

- Docker: per attempt the agent (root) mounts a ramfs (RAM only, never swapped) at
  `<root>/<container name>`, writes the files there, and the container gets it as a read-only
  bind mount at /run/secrets. Right after the container starts, the agent unmounts it on the
  host: the container's own mount namespace keeps the only reference, so the values vanish with
  the container, whatever becomes of the agent. runc and gVisor (runsc) both keep serving the
  mount after the host's is gone. A leftover mount (an agent that died between mount and start)
  is unmounted when the next agent starts (`sweep`).
- The process runtime: the files in the attempt's own directory (`secrets/`), removed with it.
  That runtime does not isolate: any process of the agent's user can read them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
from pathlib import Path

from worker_agent.runtime.base import RuntimeFailure

CONTAINER_DIR = "/run/secrets"
ROOT_DEFAULT = Path("/run/computepool-agent/secrets")
# The names the control plane accepts (environment-variable names): always a plain file name.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def check_names(secrets: dict) -> None:
    for name in secrets:
        if not NAME.fullmatch(name):
            raise RuntimeFailure("runtime_error", f"secret name {name[:64]!r} is not a file name")


def write_files(directory: Path, secrets: dict, uid: int, gid: int) -> None:
    """Each value in `directory/NAME`, mode 0400, owned by uid:gid (the job's user), created
    anew: never through a link or over an existing file."""
    check_names(secrets)
    for name, value in secrets.items():
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            os.write(fd, value.encode())
            if (uid, gid) != (os.geteuid(), os.getegid()):
                os.fchown(fd, uid, gid)
        finally:
            os.close(fd)


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


class HostMounts:
    """The Docker runtime's per-attempt ramfs mounts under `root`, one directory per container
    name; `root` is this node's own (no other agent sweeps it)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def prepare(self, name: str, secrets: dict, uid: int, gid: int) -> Path:
        """A fresh ramfs at root/name holding the files; its path (the bind mount's source)."""
        check_names(secrets)
        if os.geteuid() != 0:
            raise RuntimeFailure(
                "runtime_error",
                "secrets cannot be kept off the node's disk here: the agent is not root (it "
                "mounts a private in-memory filesystem per attempt)",
            )
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # nobody on the host lists or enters the attempts' mounts
        target = self.root / name
        self.release(name)
        target.mkdir(mode=0o700)
        libc = _libc()
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if libc.mount(b"ramfs", str(target).encode(), b"ramfs", flags, b"mode=0755") != 0:
            error = ctypes.get_errno()
            target.rmdir()
            raise RuntimeFailure(
                "runtime_error", f"secrets: mounting a ramfs failed: {os.strerror(error)}"
            )
        try:
            write_files(target, secrets, uid, gid)
        except BaseException:
            self.release(name)
            raise
        return target

    def release(self, name: str) -> None:
        """Unmounts root/name (lazily: the container keeps its own reference) and removes the
        directory; nothing to do when it is gone already."""
        target = self.root / name
        if not target.exists():
            return
        if os.path.ismount(target) and _libc().umount2(str(target).encode(), MNT_DETACH) != 0:
            error = ctypes.get_errno()
            if error not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount any more
                raise OSError(error, f"umount {target}: {os.strerror(error)}")
        shutil.rmtree(target, ignore_errors=True)

    def sweep(self) -> list[str]:
        """Everything under root (what a previous agent left): unmounted and removed."""
        if not self.root.is_dir():
            return []
        names = [entry.name for entry in os.scandir(self.root) if entry.is_dir()]
        for name in names:
            self.release(name)
        return names
