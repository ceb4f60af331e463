"""The API's one pagination: ?limit=&offset=, with limit capped.

Without a cap, ?limit=15937851620751980980338688 reached PostgreSQL as LIMIT and failed there
(a 500). Invalid or negative values fall back to the defaults; an offset past the end is an
empty page (DRF answers it without a query, so no offset reaches the database out of range).
"""

from rest_framework import pagination


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = 1000
