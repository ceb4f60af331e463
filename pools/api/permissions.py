"""The permission check points of the API, shared by every app: who is asking comes from
`Actor.from_request`, what they may see from `Model.objects.visible_to(actor)`."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from pools.actors import Actor
from pools.choices import TokenScope
from pools.models import ApiToken


def missing_scope(request, view) -> str:
    """The token scope this request needs and the caller's token lacks; "" when none is
    missing (a browser session acts with the user's rights, not a token's scopes)."""
    token = request.auth
    if not isinstance(token, ApiToken):
        return ""
    needed = TokenScope.READ if request.method in SAFE_METHODS else TokenScope.WRITE
    needed = getattr(view, "required_scope", None) or needed
    return "" if token.allows(needed) else needed


class TokenScopeAllows(BasePermission):
    """A token acts only within its scopes (403 `scope_missing`, naming the scope)."""

    def has_permission(self, request, view):
        if scope := missing_scope(request, view):
            self.message = f"This token lacks the {scope} scope that this request needs."
            self.code = "scope_missing"
            return False
        return True


class IsPerson(BasePermission):
    """A signed-in person (not a node credential) with the token scope the request needs; a
    token without it is refused with 403 `scope_missing`, naming the scope."""

    message = "Authentication as a person is required."

    def has_permission(self, request, view):
        if not Actor.from_request(request).is_person or not self.has_role(request):
            return False
        scopes = TokenScopeAllows()
        if not scopes.has_permission(request, view):
            self.message, self.code = scopes.message, scopes.code
            return False
        return True

    def has_role(self, request) -> bool:
        """Subclasses: the role this permission needs (checked before the token's scope, so a
        caller without the role is told so, not that a scope is missing)."""
        return True


class IsOperator(IsPerson):
    message = "Only operators may do this."

    def has_role(self, request) -> bool:
        return Actor.from_request(request).is_operator


class IsPolicyAdminOrReadOnly(IsPerson):
    message = "Only policy admins may change policy."

    def has_role(self, request) -> bool:
        return request.method in SAFE_METHODS or Actor.from_request(request).is_policy_admin


class IsNode(BasePermission):
    """A node's agent, authenticated with its own node credential."""

    message = "Only a node agent with its node credential may do this."

    def has_permission(self, request, view):
        return Actor.from_request(request).is_node


class IsNotNode(BasePermission):
    """Anyone but a node credential (e.g. an enrollment: a node cannot enroll other nodes)."""

    message = "A node credential cannot enroll nodes."

    def has_permission(self, request, view):
        return not Actor.from_request(request).is_node


class IsPersonOrNode(BasePermission):
    """A signed-in person (with the token scope needed) or a node's agent."""

    message = "Authentication as a person or a node is required."

    def has_permission(self, request, view):
        if IsNode().has_permission(request, view):
            return True
        person = IsPerson()
        allowed = person.has_permission(request, view)
        if not allowed and getattr(person, "code", None):  # a person's token without the scope
            self.message, self.code = person.message, person.code
        return allowed


class IsNodeOrOperator(BasePermission):
    message = "Only the node's agent (or an operator) reports usage."

    def has_permission(self, request, view):
        if IsNode().has_permission(request, view):
            return True
        operator = IsOperator()
        allowed = operator.has_permission(request, view)
        if not allowed and getattr(operator, "code", None):
            self.message, self.code = operator.message, operator.code
        return allowed
