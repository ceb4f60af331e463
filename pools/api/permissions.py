"""The permission check points of the API, shared by every app."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from pools.choices import TokenScope
from pools.models import ApiToken
from pools.roles import is_operator, is_policy_admin


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
        user = request.user
        if not (user and user.is_authenticated and getattr(user, "is_person", True)):
            return False
        return TokenScopeAllows().has_permission(request, view)


class IsOperator(IsPerson):
    message = "Only operators may do this."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and is_operator(request.user)


class IsPolicyAdminOrReadOnly(IsPerson):
    message = "Only policy admins may change policy."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        return request.method in SAFE_METHODS or is_policy_admin(request.user)
