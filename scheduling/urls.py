from django.urls import path

from . import views

urlpatterns = [
    path("console/ops/", views.ops_index, name="ops"),
    path("console/ops/capacity", views.capacity, name="ops-capacity"),
    path("console/ops/queue", views.queue, name="ops-queue"),
    path("console/queue", views.tenant_queue, name="console-queue"),
    path("console/ops/health", views.scheduler_health, name="ops-health"),
    path("console/ops/leases/<int:pk>/decision", views.lease_decision, name="ops-lease-decision"),
    path("console/ops/jobs/<int:pk>/decision", views.job_decision, name="ops-job-decision"),
    path("console/ops/nodes/<int:pk>/leases", views.node_leases, name="ops-node-leases"),
    path("console/ops/nodes/<int:pk>/usage", views.node_usage, name="ops-node-usage"),
]
