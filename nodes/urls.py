from django.urls import path

from . import views

urlpatterns = [
    path("console/nodes", views.nodes_page, name="console-nodes"),
    path("console/nodes/<int:pk>", views.node_detail, name="console-node"),
    path("console/nodes/<int:pk>/<slug:action>", views.node_action, name="console-node-action"),
]
