from django.urls import path

from . import views

urlpatterns = [
    path("console/tokens", views.tokens_page, name="console-tokens"),
    path("console/tokens/<int:pk>/revoke", views.token_revoke, name="console-token-revoke"),
    path("console/members", views.members_page, name="console-members"),
]
