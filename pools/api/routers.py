"""The API's router: every route matches with and without its trailing slash.

Django's APPEND_SLASH would answer `POST /api/v1/jobs` with a 301, which clients follow as a
GET: a submit silently turned into a read of the job list. So the API never redirects
(config.middleware.CommonMiddleware) and its routes accept both spellings instead.
"""

from rest_framework.routers import DefaultRouter

OPTIONAL_SLASH = "/?"


class OptionalSlashRouter(DefaultRouter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trailing_slash = OPTIONAL_SLASH
