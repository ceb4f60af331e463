from django.urls import path

from . import views

urlpatterns = [path("console/nodes", views.nodes_page, name="console-nodes")]
