"""Console pages (server-rendered, htmx for partial refresh)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from pools.actors import Actor
from pools.selectors import tenants_visible_to

from .selectors import jobs_for_console


@login_required
def jobs_page(request):
    actor = Actor.from_request(request)
    jobs = jobs_for_console(actor)
    tenants = tenants_visible_to(actor)
    return render(request, "console/jobs.html", {"jobs": jobs, "tenants": tenants})


@login_required
def job_table(request):
    jobs = jobs_for_console(Actor.from_request(request))
    return render(request, "console/_job_table.html", {"jobs": jobs})
