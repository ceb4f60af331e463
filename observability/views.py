"""GET /metrics: the Prometheus exposition, for those observability/access.py lets in."""

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from .access import refusal
from .collect import exposition


@require_GET
def metrics(request):
    if why := refusal(request):
        return HttpResponse(why + "\n", status=403, content_type="text/plain; charset=utf-8")
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
