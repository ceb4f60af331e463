from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from observability import views as metrics_views

from . import views
from .throttle import throttled_login

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    # Prometheus: operators, scrape tokens and METRICS_ALLOWED_CIDRS (observability/access.py)
    path("metrics", metrics_views.metrics, name="metrics"),
    # Both sign-in forms count failures and lock out guessing (config/throttle.py).
    path("admin/login/", throttled_login(admin.site.login)),
    path("admin/", admin.site.urls),
    path("accounts/login/", throttled_login(auth_views.LoginView.as_view()), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("config.api_urls")),
    # with or without the slash, like every API route: no redirect under /api/
    re_path(r"^api/schema/?$", SpectacularAPIView.as_view(), name="schema"),
    re_path(r"^api/docs/?$", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("pools.urls")),
    path("", include("nodes.urls")),
    path("", include("jobs.urls")),
    path("", include("leases.urls")),
    path("", include("scheduling.urls")),
]

# The console's styled error pages; the API's JSON error body under /api/ (config/views.py).
handler403 = "config.views.permission_denied"
handler404 = "config.views.page_not_found"
