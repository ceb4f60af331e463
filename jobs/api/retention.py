"""/api/v1/output-retention/: a tenant's own retention of outputs and logs (jobs/retention.py).
Everyone who may see the tenant's rows lists them (its members, policy admins, operators); only
its admins set (POST, one row per tenant and pool, replaced when set again) or delete them."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from jobs import retention
from jobs.models import TenantRetention
from pools.actors import Actor
from pools.api.permissions import IsPerson
from pools.knobs import RETENTION_MAX_DAYS
from pools.models import ComputePool, Tenant


class TenantRetentionSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    pool = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = TenantRetention
        fields = ["id", "tenant", "pool", "output_retention_days", "updated_at", "updated_by"]
        read_only_fields = fields


class TenantRetentionSetSerializer(serializers.Serializer):
    tenant = serializers.CharField(max_length=100)
    pool = serializers.CharField(
        max_length=100,
        allow_null=True,
        required=False,
        default=None,
        help_text="A pool's slug; null or absent: every pool without a row of its own",
    )
    output_retention_days = serializers.IntegerField(
        min_value=retention.RETENTION_MIN_DAYS, max_value=RETENTION_MAX_DAYS
    )

    def validate_tenant(self, slug):
        actor = Actor.from_request(self.context["request"])
        tenant = Tenant.objects.visible_to(actor).filter(slug=slug).first()
        if tenant is None:
            raise serializers.ValidationError("No such tenant.")
        return tenant

    def validate_pool(self, slug):
        if slug is None:
            return None
        pool = ComputePool.objects.filter(slug=slug).first()
        if pool is None:
            raise serializers.ValidationError("No such pool.")
        return pool


class TenantRetentionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    permission_classes = [IsPerson]
    serializer_class = TenantRetentionSerializer
    required_scope = None  # read or write by method
    pagination_class = None  # a plain list: a few rows per tenant

    def get_queryset(self):
        actor = Actor.from_request(self.request)
        return TenantRetention.objects.visible_to(actor).select_related("tenant", "pool")

    @extend_schema(request=TenantRetentionSetSerializer, responses={200: TenantRetentionSerializer})
    def create(self, request):
        """Set the tenant's days for a pool (or every pool); a tenant admin only."""
        body = TenantRetentionSetSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        actor = Actor.from_request(request)
        if not actor.is_tenant_admin(data["tenant"].pk):
            raise PermissionDenied("Only the tenant's admins set its retention.")
        row = retention.retention_set(
            tenant=data["tenant"],
            pool=data["pool"],
            days=data["output_retention_days"],
            actor=actor,
        )
        return Response(TenantRetentionSerializer(row).data, status=status.HTTP_200_OK)

    def destroy(self, request, pk=None):
        """Remove the row: the tenant's jobs there follow the next rule (its row for every
        pool, else the pool's knob); a tenant admin only."""
        row = self.get_object()
        if not Actor.from_request(request).is_tenant_admin(row.tenant_id):
            raise PermissionDenied("Only the tenant's admins set its retention.")
        retention.retention_clear(row=row)
        return Response(status=status.HTTP_204_NO_CONTENT)
