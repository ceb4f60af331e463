"""Hand-written lease routes; the lease viewset is on config/api_urls.py's router. The
trailing slash is optional, as on every API route (pools/api/routers.py says why)."""

from django.urls import re_path

from leases.api.views import pool_capacity

urlpatterns = [
    re_path(r"^pools/(?P<slug>[-\w]+)/capacity/?$", pool_capacity, name="pool-capacity"),
]
