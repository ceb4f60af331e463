from django.urls import path

from . import views

urlpatterns = [
    path("", views.dashboard, name="console-dashboard"),
    path("console/dashboard/live", views.dashboard_live, name="console-dashboard-live"),
    path("console/jobs", views.jobs_page, name="console-jobs"),
    path("console/jobs/table", views.job_table, name="console-job-table"),
    path("console/jobs/new", views.job_new, name="console-job-new"),
    path("console/jobs/new/priorities", views.job_new_priorities, name="console-job-priorities"),
    path("console/jobs/new/shapes", views.job_new_shapes, name="console-job-shapes"),
    path("console/jobs/new/preview", views.job_preview, name="console-job-preview"),
    path("console/jobs/<int:pk>", views.job_detail, name="console-job"),
    path("console/jobs/<int:pk>/timeline", views.job_timeline, name="console-job-timeline"),
    path("console/jobs/<int:pk>/log", views.job_log, name="console-job-log"),
    path("console/jobs/<int:pk>/log.txt", views.job_log_download, name="console-job-log-download"),
    path("console/jobs/<int:pk>/explain", views.job_explain, name="console-job-explain"),
    path("console/jobs/<int:pk>/cancel", views.job_cancel, name="console-job-cancel"),
]
