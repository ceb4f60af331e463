"""Console pages (server-rendered, htmx for partial refresh)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from pools.roles import is_operator
from pools.selectors import tenants_visible_to

from .selectors import jobs_for_console


def console_context(request, **extra):
    return {"is_operator": is_operator(request.user), **extra}


@login_required
def jobs_page(request):
    jobs = jobs_for_console(request.user)
    tenants = tenants_visible_to(request.user)
    return render(
        request, "console/jobs.html", console_context(request, jobs=jobs, tenants=tenants)
    )


@login_required
def job_table(request):
    jobs = jobs_for_console(request.user)
    return render(request, "console/_job_table.html", {"jobs": jobs})
