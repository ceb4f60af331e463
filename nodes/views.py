"""Operator console pages for nodes."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from jobs.views import console_context
from pools.roles import is_operator

from .selectors import nodes_with_latest_event


@login_required
def nodes_page(request):
    if not is_operator(request.user):
        raise PermissionDenied("Only operators see nodes.")
    return render(
        request, "console/nodes.html", console_context(request, nodes=nodes_with_latest_event())
    )
