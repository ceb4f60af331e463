"""/api/v1/buckets: a tenant's registered buckets of S3-compatible stores (docs/storage.md,
"Object stores: buckets, inputs and outputs"). The tenant's people list them; its admins
register (after a HEAD of the bucket with the credentials) and remove them; nobody else,
operators included. Credentials are write-only: no answer, event or log carries them."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from pools import objectstore, services
from pools.actors import Actor
from pools.api.permissions import IsPerson
from pools.api.serializers import KnownFieldsOnly
from pools.models import ServerSideEncryption, Tenant, TenantBucket, TenantBucketEvent

ADMINS_ONLY = "Only this tenant's admins register or remove its buckets."


class BucketSerializer(KnownFieldsOnly, serializers.ModelSerializer):
    """A registered bucket; `access_key_id` and `secret_access_key` are write-only."""

    tenant = serializers.SlugField(source="tenant.slug", max_length=60)
    location = serializers.SerializerMethodField()
    access_key_id = serializers.CharField(
        write_only=True, max_length=128, style={"input_type": "password"}
    )
    secret_access_key = serializers.CharField(
        write_only=True, max_length=256, trim_whitespace=False, style={"input_type": "password"}
    )
    endpoint = serializers.URLField(max_length=300)
    region = serializers.RegexField(r"^[a-z0-9-]{1,40}$", max_length=40, default="us-east-1")
    server_side_encryption = serializers.ChoiceField(
        choices=ServerSideEncryption.choices, default=ServerSideEncryption.AES256
    )

    class Meta:
        model = TenantBucket
        fields = [
            "id",
            "tenant",
            "bucket",
            "location",
            "endpoint",
            "region",
            "server_side_encryption",
            "access_key_id",
            "secret_access_key",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]
        validators = []  # registering a bucket again replaces it (new credentials)

    def get_location(self, row) -> str:
        return f"s3://{row.bucket}/"

    def validate_bucket(self, value):
        try:
            objectstore.parse_url(f"s3://{value}/")
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None
        return value

    def validate_endpoint(self, value):
        if not objectstore.registered_endpoint(value):
            raise serializers.ValidationError(
                "Not an endpoint of OBJECT_STORE_ENDPOINTS (the stores this control plane "
                "reaches; an operator registers them)."
            )
        return value.rstrip("/")


class BucketEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")
    tenant = serializers.SlugField(source="tenant.slug")

    class Meta:
        model = TenantBucketEvent
        fields = ["at", "tenant", "bucket", "actor", "from_state", "to_state", "reason", "data"]


class BucketViewSet(viewsets.GenericViewSet):
    permission_classes = [IsPerson]
    serializer_class = BucketSerializer
    pagination_class = None  # a tenant has few: a plain list

    def actor(self) -> Actor:
        return Actor.from_request(self.request)

    def get_queryset(self):
        """The buckets of the caller's own tenants (operators see none: tenants' config)."""
        actor = self.actor()
        rows = TenantBucket.objects.visible_to(actor).filter(tenant_id__in=list(actor.tenant_roles))
        if slug := self.request.query_params.get("tenant"):
            rows = rows.filter(tenant__slug=slug)
        return rows.select_related("tenant")

    @extend_schema(responses=BucketSerializer(many=True))
    def list(self, request):
        return Response(BucketSerializer(self.get_queryset(), many=True).data)

    @extend_schema(responses=BucketSerializer)
    def retrieve(self, request, pk=None):
        row = get_object_or_404(self.get_queryset(), pk=_number(pk))
        return Response(BucketSerializer(row).data)

    @extend_schema(request=BucketSerializer, responses={201: BucketSerializer})
    def create(self, request):
        """Registers (or re-registers, with new credentials) a bucket after a HEAD of it with
        the credentials: a 400 names the field to fix when the store refuses."""
        actor = self.actor()
        slug = request.data.get("tenant") if hasattr(request.data, "get") else None
        tenant = Tenant.objects.filter(slug=str(slug)[:60], pk__in=list(actor.tenant_roles)).first()
        if tenant is not None and not actor.is_tenant_admin(tenant.pk):
            raise PermissionDenied(ADMINS_ONLY)  # before the body: a member learns no more
        serializer = BucketSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        data.pop("tenant")
        if tenant is None:  # the same answer for "no such tenant" and "not yours"
            raise serializers.ValidationError({"tenant": ["No tenant of yours has this slug."]})
        try:
            row = services.bucket_register(tenant=tenant, actor=actor, **data)
        except DjangoValidationError as error:
            raise serializers.ValidationError(error.message_dict) from None
        return Response(BucketSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request, pk=None):
        actor = self.actor()
        row = get_object_or_404(self.get_queryset(), pk=_number(pk))
        if not actor.is_tenant_admin(row.tenant_id):
            raise PermissionDenied(ADMINS_ONLY)
        services.bucket_remove(row=row, actor=actor)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=BucketEventSerializer(many=True))
    @action(detail=False, methods=["get"])
    def events(self, request):
        """Registrations and removals of the caller's tenants' buckets, newest first: its
        admins read them (`?tenant=slug` narrows)."""
        actor = self.actor()
        admin_of = [pk for pk in actor.tenant_roles if actor.is_tenant_admin(pk)]
        if not admin_of:
            raise PermissionDenied("Only a tenant's admins read its buckets' history.")
        events = TenantBucketEvent.objects.visible_to(actor).filter(tenant_id__in=admin_of)
        if slug := request.query_params.get("tenant"):
            events = events.filter(tenant__slug=slug)
        events = events.select_related("tenant").order_by("-at", "-id")[:1000]
        return Response(BucketEventSerializer(events, many=True).data)


def _number(pk) -> int:
    return int(pk) if str(pk).isdigit() and len(str(pk)) < 19 else 0
