from django.contrib.admin import AdminSite

from pools.roles import is_policy_admin, is_shape_admin


class PolicyAdminSite(AdminSite):
    """The Django admin is the tool of the policy admins (quotas, priorities, registries,
    policy versions) and the shape admins (shapes); each role's group holds the permissions of
    its own models only (pools.services.ADMIN_MODELS)."""

    site_header = "Compute Pool policy administration"
    site_title = "Compute Pool admin"

    def has_permission(self, request):
        user = request.user
        return user.is_active and (is_policy_admin(user) or is_shape_admin(user))
