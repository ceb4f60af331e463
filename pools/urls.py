from django.urls import path

from . import views

urlpatterns = [
    path("console/tokens", views.tokens_page, name="console-tokens"),
    path("console/tokens/<int:pk>/revoke", views.token_revoke, name="console-token-revoke"),
    path("console/members", views.members_page, name="console-members"),
    path("console/members/<int:pk>/role", views.member_role, name="console-member-role"),
    path("console/members/<int:pk>/remove", views.member_remove, name="console-member-remove"),
    path("console/support-grants", views.support_grants_page, name="console-support-grants"),
    path(
        "console/support-grants/<int:pk>/revoke",
        views.support_grant_revoke,
        name="console-support-grant-revoke",
    ),
]
