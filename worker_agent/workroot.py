"""Where jobs' files live on the node: the work root, apart from the agent's state.

The state directory holds the node credential (0600); nothing of it is ever mounted into a
job. Every attempt (and probe) gets a directory below the work root, and only folders below an
attempt's directory are mounted into its container. The two trees are disjoint: a work root
inside the state directory (or the other way round) is refused at start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from worker_agent.runtime import disks

log = logging.getLogger(__name__)


class WorkRootError(ValueError):
    """The work root overlaps the state directory."""


def default_work_root(state_dir: str | os.PathLike) -> Path:
    """`<state dir>.work`, beside the state directory (never inside it)."""
    state = Path(state_dir).absolute()
    return state.with_name(state.name + ".work")


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class WorkRoot:
    def __init__(self, directory: str | os.PathLike, state_dir: str | os.PathLike):
        self.dir = Path(directory).absolute()
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)  # mounts are made by the engine (root): jobs need no way in
        here, state = self.dir.resolve(), Path(state_dir).resolve()
        if _within(here, state) or _within(state, here):
            raise WorkRootError(
                f"the work root {here} and the state directory {state} must not contain each "
                "other: job files would be mounted beside the node credential"
            )

    def attempt_path(self, job: int, attempt: int) -> Path:
        return self.attempts / f"job{int(job)}-a{int(attempt)}"

    def attempt_dir(self, job: int, attempt: int) -> Path:
        """Where one attempt's inputs/, outputs/ (and, for the process runtime, scratch/ and
        its log) live; created on first use."""
        path = self.attempt_path(job, attempt)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def sweep(self, keep=()) -> list[Path]:
        """Deletes every attempt and probe directory but `keep` (what a previous agent left of
        runs that are gone), its filesystems unmounted first; the paths it removed."""
        keep = {Path(path) for path in keep}
        removed = []
        for folder in (self.attempts, self.dir / "probes"):
            for path in sorted(folder.iterdir()) if folder.is_dir() else ():
                if path in keep or not path.is_dir() or path.is_symlink():
                    continue
                disks.delete(path)
                removed.append(path)
        if removed:
            log.info("removed %d leftover attempt directories", len(removed))
        return removed

    def remove_attempt(self, job: int, attempt: int) -> None:
        """One attempt's directory deleted (its run removed by the agent's loop)."""
        path = self.attempt_path(job, attempt)
        if path.is_dir() and not path.is_symlink():
            disks.delete(path)

    def probe_dir(self, probe: int) -> Path:
        return self.dir / "probes" / str(int(probe))

    @property
    def attempts(self) -> Path:
        return self.dir / "attempts"
