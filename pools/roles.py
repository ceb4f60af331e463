"""Who holds which role. Tenant roles are memberships; platform roles are Django groups."""

from .choices import PlatformRole, TenantRole


def has_platform_role(user, *roles: str) -> bool:
    """True when the user holds any of `roles`; a superuser holds every role."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if user.is_superuser:
        return True
    names = getattr(user, "_platform_roles", None)
    if names is None:
        names = frozenset(user.groups.values_list("name", flat=True))
        user._platform_roles = names  # cached on the request's user object
    return any(role in names for role in roles)


def is_operator(user) -> bool:
    return has_platform_role(user, PlatformRole.OPERATOR)


def is_policy_admin(user) -> bool:
    return has_platform_role(user, PlatformRole.POLICY_ADMIN)


def is_shape_admin(user) -> bool:
    return has_platform_role(user, PlatformRole.SHAPE_ADMIN)


def tenant_roles(user) -> dict[int, str]:
    """tenant id → role for a person's memberships."""
    if user is None or not getattr(user, "is_authenticated", False):
        return {}
    cached = getattr(user, "_tenant_roles", None)
    if cached is None:
        cached = dict(user.memberships.values_list("tenant_id", "role"))
        user._tenant_roles = cached
    return cached


def is_tenant_admin(user, tenant_id: int) -> bool:
    """Holds the admin role in the tenant itself. Operators never do (they hold no membership,
    pools.services.member_add): a tenant's members, secrets and support grants are its own."""
    return tenant_roles(user).get(tenant_id) == TenantRole.ADMIN
