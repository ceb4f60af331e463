"""Who is asking: a person (with roles), a node's agent, the system itself, or nobody.

`Actor.from_request` is the one place that decides it for a request; the API, the console and
the selectors take the actor it returns, and `Model.objects.visible_to(actor)` (pools.visibility)
answers what that actor may see. Roles are read lazily (and cached on the user by pools.roles),
so building an actor costs no query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .choices import PlatformRole
from .roles import has_platform_role, is_tenant_admin, tenant_roles


class NodePrincipal:
    """The `request.user` of a node credential: a node's agent, never a person."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_superuser = False
    is_staff = False
    pk = None
    id = None
    # pools.roles caches: a node holds no platform role and no tenant membership
    _platform_roles = frozenset()
    _tenant_roles: dict = {}

    def __init__(self, node, credential=None):
        self.node = node
        self.credential = credential

    def get_username(self) -> str:
        return f"node:{self.node.name}"

    @property
    def username(self) -> str:
        return self.get_username()

    def __str__(self):
        return self.get_username()


@dataclass(frozen=True)
class Actor:
    PERSON = "user"  # the value stored in events' actor_kind
    NODE = "node"
    SYSTEM = "system"
    ANONYMOUS = "anonymous"

    kind: str
    label: str
    user: Any = None
    node: Any = None

    @classmethod
    def from_request(cls, request) -> Actor:
        """Who is asking in this request (DRF or Django, API or console)."""
        return cls.for_user(getattr(request, "user", None))

    @classmethod
    def for_user(cls, user) -> Actor:
        """The actor of an authenticated principal: a person or a node's agent; else nobody."""
        if isinstance(user, NodePrincipal):
            return cls.for_node(user.node)
        if user is None or not user.is_authenticated:
            return cls(kind=cls.ANONYMOUS, label="anonymous")
        return cls(kind=cls.PERSON, label=f"user:{user.get_username()}", user=user)

    @classmethod
    def for_node(cls, node) -> Actor:
        return cls(kind=cls.NODE, label=f"node:{node.name}", node=node)

    @classmethod
    def system(cls, component: str) -> Actor:
        return cls(kind=cls.SYSTEM, label=f"system:{component}")

    @property
    def user_id(self):
        return getattr(self.user, "pk", None)

    @property
    def is_person(self) -> bool:
        return self.kind == self.PERSON

    @property
    def is_node(self) -> bool:
        return self.kind == self.NODE

    @property
    def is_system(self) -> bool:
        return self.kind == self.SYSTEM

    # --- a person's roles (nobody else holds any) ---------------------------------------------

    def has_role(self, *roles: str) -> bool:
        """Holds any of these platform roles (a superuser holds every role)."""
        return self.is_person and has_platform_role(self.user, *roles)

    @property
    def is_operator(self) -> bool:
        return self.has_role(PlatformRole.OPERATOR)

    @property
    def is_policy_admin(self) -> bool:
        return self.has_role(PlatformRole.POLICY_ADMIN)

    @property
    def is_shape_admin(self) -> bool:
        return self.has_role(PlatformRole.SHAPE_ADMIN)

    @property
    def tenant_roles(self) -> dict[int, str]:
        """tenant id → role of this person's memberships."""
        return tenant_roles(self.user) if self.is_person else {}

    @property
    def tenant_ids(self) -> list[int]:
        return list(self.tenant_roles)

    def is_tenant_admin(self, tenant_id: int) -> bool:
        return self.is_person and is_tenant_admin(self.user, tenant_id)
