from django.urls import path

from . import views

urlpatterns = [
    path("console/nodes", views.nodes_page, name="console-nodes"),
    path("console/nodes/tokens", views.enrollment_tokens, name="console-enrollment-tokens"),
    path(
        "console/nodes/tokens/<int:pk>/revoke",
        views.enrollment_token_revoke,
        name="console-enrollment-token-revoke",
    ),
    path("console/nodes/<int:pk>", views.node_detail, name="console-node"),
    path("console/nodes/<int:pk>/row", views.node_row, name="console-node-row"),
    path("console/nodes/<int:pk>/events", views.node_events, name="console-node-events"),
    path("console/nodes/<int:pk>/<slug:action>", views.node_action, name="console-node-action"),
]
