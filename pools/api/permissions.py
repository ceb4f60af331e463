"""The permission check points of the API, shared by every app: who is asking comes from
`Actor.from_request`, what they may see from `Model.objects.visible_to(actor)`."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from pools.actors import Actor
from pools.choices import TokenScope
from pools.models import ApiToken


class TokenScopeAllows(BasePermission):
    """A token acts only within its scopes; a browser session acts with the user's rights."""

    message = "This token's scopes do not allow this request."

    def has_permission(self, request, view):
        token = request.auth
        if not isinstance(token, ApiToken):
            return True
        needed = TokenScope.READ if request.method in SAFE_METHODS else TokenScope.WRITE
        needed = getattr(view, "required_scope", None) or needed
        return token.allows(needed)


class IsPerson(BasePermission):
    """A signed-in person (not a node credential) with the token scope the request needs."""

    message = "Authentication as a person is required."

    def has_permission(self, request, view):
        if not Actor.from_request(request).is_person:
            return False
        return TokenScopeAllows().has_permission(request, view)


class IsOperator(IsPerson):
    message = "Only operators may do this."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and Actor.from_request(request).is_operator


class IsPolicyAdminOrReadOnly(IsPerson):
    message = "Only policy admins may change policy."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
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
        return IsNode().has_permission(request, view) or IsPerson().has_permission(request, view)


class IsNodeOrOperator(BasePermission):
    message = "Only the node's agent (or an operator) reports usage."

    def has_permission(self, request, view):
        return IsNode().has_permission(request, view) or IsOperator().has_permission(request, view)
