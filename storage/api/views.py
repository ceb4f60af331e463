"""/api/v1/volumes: a tenant's persistent volumes (create, list, retrieve, delete, events);
/api/v1/agent/volumes: what a node's agent holds, answered with what it must remove.

People see their tenants' volumes (operators all); other tenants' are 404, never 403. The
export of a volume (`POST /api/v1/volumes/{id}/export`) runs as a job: jobs/api/volumes.py."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from nodes.api.views import NodeErrorsMixin
from pools.actors import Actor
from pools.api.permissions import IsNode, IsPerson
from pools.choices import TenantRole
from pools.roles import tenant_roles
from storage import selectors, services
from storage.api.serializers import (
    VolumeCreateSerializer,
    VolumeEventSerializer,
    VolumeReportSerializer,
    VolumeSerializer,
)


class VolumeViewSet(
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.ReadOnlyModelViewSet,
):
    permission_classes = [IsPerson]
    serializer_class = VolumeSerializer
    required_scope = None  # read or write by method
    filterset_fields = {
        "state": ["exact", "in"],
        "tenant__slug": ["exact"],
        "pool__slug": ["exact"],
    }

    def get_queryset(self):
        volumes = selectors.volumes_visible_to(Actor.from_request(self.request))
        return volumes.prefetch_related("attachments").order_by("id")

    @extend_schema(request=VolumeCreateSerializer, responses={201: VolumeSerializer, 409: dict})
    def create(self, request, *args, **kwargs):
        body = VolumeCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        volume = services.volume_create(
            tenant=data["tenant"],
            pool=data["pool"],
            name=data["name"],
            size_mib=data["size_mib"],
            zone=data["zone"],
            node_name=data["node"],
            retention_days=data["retention_days"],
            actor=Actor.from_request(request),
        )
        volume = self.get_queryset().get(pk=volume.pk)
        return Response(VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: VolumeSerializer, 409: dict})
    def destroy(self, request, *args, **kwargs):
        """Deletes it (409 `volume_in_use` while a job mounts it); 200 with the volume as it
        is now (`deleted`): its node removes the image at its next report."""
        volume = self.get_object()
        # the tenant's data: its people delete it, never an operator (metadata only)
        if tenant_roles(request.user).get(volume.tenant_id) not in (
            TenantRole.MEMBER,
            TenantRole.ADMIN,
        ):
            raise PermissionDenied("Only the tenant's members and admins delete its volumes.")
        volume = services.volume_delete(volume=volume, actor=Actor.from_request(request))
        volume = self.get_queryset().get(pk=volume.pk)
        return Response(VolumeSerializer(volume).data)

    @extend_schema(responses=VolumeEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        events = self.get_object().events.order_by("pk")[:1000]
        return Response(VolumeEventSerializer(events, many=True).data)


class AgentVolumesViewSet(NodeErrorsMixin, viewsets.GenericViewSet):
    """The asking node's volumes only."""

    permission_classes = [IsNode]
    serializer_class = VolumeReportSerializer

    @extend_schema(request=VolumeReportSerializer, responses={200: dict})
    @action(detail=False, methods=["post"])
    def volumes(self, request):
        body = VolumeReportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = Actor.from_request(request).node
        answer = services.volumes_reconcile(node=node, reported=body.validated_data["volumes"])
        return Response(answer)
