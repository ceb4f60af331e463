"""GET /api/v1/quotas/: a tenant's quotas and credit, pool by pool, with what it uses of each
dimension now. Here, not in pools' API, because usage is the ledger's to count (pools sits
below leases). People see their own tenants' rows (policy admins every row); another tenant's
are never listed."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets

from leases.selectors import quota_rows
from pools.actors import Actor
from pools.api.permissions import IsPerson
from pools.api.serializers import QuotaSerializer
from pools.models import Quota


class QuotaViewSet(viewsets.GenericViewSet):
    permission_classes = [IsPerson]
    serializer_class = QuotaSerializer
    queryset = Quota.objects.none()  # rows are built per (tenant, pool) in `list`

    @extend_schema(responses=QuotaSerializer(many=True))
    def list(self, request):
        rows = quota_rows(Actor.from_request(request), timezone.now())
        page = self.paginate_queryset(rows)
        body = [row | {"tenant": row["tenant"].slug, "pool": row["pool"].slug} for row in page]
        return self.get_paginated_response(QuotaSerializer(body, many=True).data)
