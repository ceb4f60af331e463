"""Size-capped filesystems for a job's /outputs and /scratch (docs/data-plane.md, "Disk
limits").

Overlay2 on ext4 has no per-container size option, so the agent (root) makes each one itself: a
sparse image file of the limit's size beside the mount point (`<attempt>/outputs.img`), an ext4
filesystem in it (no journal, no reserved blocks, its root owned by the job's user), loop-
mounted nosuid,nodev at the mount point, which the container gets as a bind mount. A job that
writes past it gets ENOSPC; the node's disk holds no more than the image. When the attempt
ends the filesystems below its directory are unmounted and the images deleted; a restarted
agent does the same for attempts that are gone (worker_agent/workroot.py `sweep`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from worker_agent.runtime.base import JOB_USER_ID, RuntimeFailure

log = logging.getLogger(__name__)

MIB = 1024 * 1024
TOOLS = ("mkfs.ext4", "mount", "umount")
COMMAND_TIMEOUT_S = 60
MOUNTINFO = Path("/proc/self/mountinfo")


def enforcement_problem() -> str | None:
    """Why this node cannot make the filesystems (None: it can)."""
    if os.geteuid() != 0:
        return "the agent is not root (loop mounts need it)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control)"
    return None


def unenforceable(problem: str) -> RuntimeFailure:
    return RuntimeFailure(
        "runtime_error", f"disk limits cannot be enforced on this node: {problem}; not run"
    )


def _run(*command: str) -> None:
    try:
        subprocess.run(
            command, check=True, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or "").strip()[:300]
        raise RuntimeFailure("runtime_error", f"{command[0]} failed: {detail}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeFailure("runtime_error", f"{command[0]} failed: {exc}") from exc


def image_of(folder: Path) -> Path:
    return folder.with_name(folder.name + ".img")


def make(folder: Path, size_mib: int) -> None:
    """An empty filesystem of `size_mib` MiB mounted at `folder` (created), writable by the
    job's user only."""
    if size_mib <= 0:
        raise ValueError("a filesystem has a size")
    image = image_of(folder)
    folder.mkdir(mode=0o755, exist_ok=True)
    with open(image, "xb") as blank:
        blank.truncate(size_mib * MIB)  # sparse: the node's disk fills as the job writes
    owner = f"{JOB_USER_ID}:{JOB_USER_ID}"
    _run(
        "mkfs.ext4",
        "-q",
        "-F",
        "-m",
        "0",
        "-O",
        "^has_journal",
        "-E",
        f"root_owner={owner}",
        str(image),
    )
    _run("mount", "-o", "loop,nosuid,nodev", str(image), str(folder))
    with contextlib.suppress(FileNotFoundError):
        (folder / "lost+found").rmdir()  # the fresh filesystem's own: not a job's output


def mounted_below(root: Path) -> list[Path]:
    """Mount points at or below `root`, deepest first."""
    root = Path(os.path.realpath(root))
    points = []
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = Path(_unescape(fields[4]))
        if point == root or root in point.parents:
            points.append(point)
    return sorted(set(points), key=lambda p: len(p.parts), reverse=True)


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def release(root: Path) -> None:
    """Unmounts every filesystem below `root` (lazily when one is still busy) and deletes the
    images beside them."""
    for point in mounted_below(root):
        try:
            _run("umount", str(point))
        except RuntimeFailure:
            log.warning("%s busy: unmounted lazily", point)
            with contextlib.suppress(RuntimeFailure):
                _run("umount", "-l", str(point))
        image_of(point).unlink(missing_ok=True)


def delete(root: Path) -> None:
    """`root` deleted with all below it, its filesystems released first: never deleting
    through a mount."""
    release(root)
    shutil.rmtree(root, ignore_errors=True)
