"""Lease routes; the trailing slash is optional (POST /api/v1/compute-leases works as written)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduling.api.views import LeaseViewSet, pool_capacity


class OptionalSlashRouter(SimpleRouter):
    def __init__(self):
        super().__init__()
        self.trailing_slash = "/?"


router = OptionalSlashRouter()
router.register("compute-leases", LeaseViewSet, basename="compute-lease")

urlpatterns = [
    path("pools/<slug:slug>/capacity", pool_capacity, name="pool-capacity"),
    *router.urls,
]
