from django.urls import path

from . import views

urlpatterns = [
    path("console/leases", views.leases_page, name="console-leases"),
    path("console/leases/<int:pk>/release", views.lease_release, name="console-lease-release"),
]
