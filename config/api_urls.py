"""/api/v1/: every app registers its viewsets on one router; every route, the hand-written ones
too, matches with and without its trailing slash (pools/api/routers.py)."""

from django.urls import include, path, re_path

from jobs.api.agent import AgentJobsViewSet
from jobs.api.retention import TenantRetentionViewSet
from jobs.api.views import JobViewSet
from jobs.api.volumes import VolumeExportViewSet
from jobs.api.wait import assignments_wait
from leases.api.quotas import QuotaViewSet
from leases.api.views import LeaseViewSet
from nodes.api.views import AgentViewSet, EnrollmentTokenViewSet, EnrollViewSet, NodeViewSet
from pools.api.buckets import BucketViewSet
from pools.api.routers import OptionalSlashRouter
from pools.api.views import (
    ApiTokenViewSet,
    ComputePoolViewSet,
    PoolViewSet,
    ShapeViewSet,
    TenantViewSet,
    me,
)
from scheduling.api.agent import AgentDrainViewSet
from storage.api.views import AgentVolumesViewSet, VolumeViewSet

router = OptionalSlashRouter()
# Routes are tried in registration order and Django copies the list of those tried at every
# level of the URLconf: the lease grant, the hottest route, comes first (50 -> 22 us a resolve).
router.register("compute-leases", LeaseViewSet, basename="compute-lease")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("compute-pools", ComputePoolViewSet, basename="compute-pool")
router.register("pools", PoolViewSet, basename="pool")  # alias by slug, with policy versions
router.register("shapes", ShapeViewSet, basename="shape")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("buckets", BucketViewSet, basename="bucket")  # pools/api/buckets.py
router.register("jobs", JobViewSet, basename="job")
router.register("quotas", QuotaViewSet, basename="quota")  # leases/api/quotas.py
router.register("output-retention", TenantRetentionViewSet, basename="output-retention")
router.register("nodes", NodeViewSet, basename="node")
router.register("enrollment-tokens", EnrollmentTokenViewSet, basename="enrollment-token")
router.register("enroll", EnrollViewSet, basename="enroll")
router.register("agent", AgentViewSet, basename="agent")
router.register("agent", AgentDrainViewSet, basename="agent-drain")
router.register("agent", AgentJobsViewSet, basename="agent-jobs")  # assignments, reports, uploads
router.register("volumes", VolumeViewSet, basename="volume")  # storage/api/views.py
router.register("volumes", VolumeExportViewSet, basename="volume-export")  # jobs/api/volumes.py
router.register("agent", AgentVolumesViewSet, basename="agent-volumes")  # what a node holds

urlpatterns = [
    re_path(r"^me/?$", me, name="me"),
    # the agent's long poll for a push: an async view (jobs/api/wait.py), not the router's
    re_path(r"^agent/assignments/wait/?$", assignments_wait, name="agent-assignments-wait"),
    path("", include("leases.api.urls")),
    path("", include(router.urls)),
]
