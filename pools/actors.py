"""Who is asking: a person, a node's agent, or the system itself (a sweep, the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Actor:
    kind: str  # "user" | "node" | "system"
    label: str
    user: Any = None
    node: Any = None

    @classmethod
    def for_user(cls, user) -> Actor:
        """The actor of an authenticated request: a person, or a node agent's principal."""
        if getattr(user, "is_person", True) is False and getattr(user, "node", None) is not None:
            return cls.for_node(user.node)
        return cls(kind="user", label=f"user:{user.get_username()}", user=user)

    @classmethod
    def for_node(cls, node) -> Actor:
        return cls(kind="node", label=f"node:{node.name}", node=node)

    @classmethod
    def system(cls, component: str) -> Actor:
        return cls(kind="system", label=f"system:{component}")

    @property
    def user_id(self):
        return getattr(self.user, "pk", None)
