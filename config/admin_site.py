from django.contrib.admin import AdminSite

from pools.roles import is_policy_admin


class PolicyAdminSite(AdminSite):
    """The Django admin is the policy admins' tool (shapes, quotas, priorities, policy)."""

    site_header = "Compute Pool policy administration"
    site_title = "Compute Pool admin"

    def has_permission(self, request):
        return request.user.is_active and is_policy_admin(request.user)
