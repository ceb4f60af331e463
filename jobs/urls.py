from django.urls import path

from . import views

urlpatterns = [
    path("", views.jobs_page, name="console-jobs"),
    path("console/jobs/table", views.job_table, name="console-job-table"),
]
