"""/api/v1/: every app registers its viewsets on one router."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from jobs.api.views import JobViewSet
from nodes.api.views import AgentViewSet, EnrollmentTokenViewSet, EnrollViewSet, NodeViewSet
from pools.api.views import ApiTokenViewSet, PoolViewSet, ShapeViewSet, TenantViewSet, me

router = DefaultRouter()
router.register("tenants", TenantViewSet, basename="tenant")
router.register("pools", PoolViewSet, basename="pool")
router.register("shapes", ShapeViewSet, basename="shape")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("jobs", JobViewSet, basename="job")
router.register("nodes", NodeViewSet, basename="node")
router.register("enrollment-tokens", EnrollmentTokenViewSet, basename="enrollment-token")
router.register("enroll", EnrollViewSet, basename="enroll")
router.register("agent", AgentViewSet, basename="agent")

urlpatterns = [
    path("me", me, name="me"),
    path("", include("scheduling.api.urls")),
    path("", include(router.urls)),
]
