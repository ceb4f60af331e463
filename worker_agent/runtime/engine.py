"""One Docker engine as one node's agent uses it: its client, and which of its containers are
this node's (base.Owner).

Several agents may share the engine. Every container an agent makes carries its owner's labels
(control-plane id and node id) and a name that starts with the control-plane id; the agent
finds, adopts and removes only what carries both labels of its own, never a container by its
name alone. The job containers (runtime/docker.py) and their network owners
(runtime/network_owner.py) are named and checked here.
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime

import docker
from docker.errors import APIError, NotFound

from worker_agent.runtime.base import Assignment, Owner, RuntimeFailure

TIMESTAMP_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,6})?")


def moment(text: str | None) -> datetime | None:
    """An engine timestamp (nanoseconds, Z) as an aware datetime; None when unset (0001-…)."""
    match = TIMESTAMP_RE.match(text or "")
    if not match or text.startswith("0001-"):
        return None
    return datetime.fromisoformat(match.group(1) + (match.group(2) or "")).replace(tzinfo=UTC)


def seconds_since_start(container) -> float:
    """Seconds since the container started (0 if unknown), from its last inspection."""
    started = moment(container.attrs["State"].get("StartedAt"))
    return max(0.0, (datetime.now(UTC) - started).total_seconds()) if started else 0.0


def never_started(container) -> bool:
    """Whether the container was created and never started (its last inspection): an agent
    that died between create and start left it."""
    return container.attrs["State"].get("Status") == "created"


class Engine:
    def __init__(self, client: docker.DockerClient, owner: Owner | None = None):
        self.client = client
        # None until the agent knows who it is (enrollment): nothing is created or found before
        self.owner = owner

    def owned_by(self) -> Owner:
        if self.owner is None:
            raise RuntimeFailure("runtime_error", "the agent is not enrolled: no owner to run as")
        return self.owner

    def labels(self, assignment: Assignment) -> dict[str, str]:
        return assignment.labels(self.owned_by())

    def container_name(self, assignment: Assignment) -> str:
        return f"{self.owned_by().prefix}-job{assignment.job}-l{assignment.lease}"

    def ours(self, container) -> bool:
        """Whether a container carries this agent's control-plane and node ids."""
        return self.owner is not None and self.owner.owns(container.labels)

    def get(self, name: str):
        """The container of that name, whoever's it is (None: there is none)."""
        try:
            return self.client.containers.get(name)
        except NotFound:
            return None

    def remove_ours(self, name: str) -> None:
        """The container of that name, when it is ours (never one by its name alone)."""
        container = self.get(name)
        if container is not None and self.ours(container):
            remove_container(container)


def remove_container(container) -> None:
    """Gone with its anonymous volumes; already gone (or going) is fine."""
    with contextlib.suppress(NotFound, APIError):
        container.remove(force=True, v=True)
