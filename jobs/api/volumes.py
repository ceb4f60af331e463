"""/api/v1/volumes/{id}/export: a volume copied to a bucket of its tenant, as a job of the
tenant on the volume's node (jobs/volume_export.py; docs/storage.md "Persistent volumes").
The rest of /api/v1/volumes is storage's (storage/api/views.py)."""

from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from jobs import volume_export
from jobs.api.serializers import JobSubmitSerializer
from pools.actors import Actor
from pools.api.permissions import IsPerson
from storage import selectors
from storage.api.serializers import ExportSerializer


class VolumeExportViewSet(viewsets.GenericViewSet):
    """Who asks: a person who sees the volume (others: 404), one of its tenant's people (an
    operator who sees it: 403), with a token of the `write` scope."""

    permission_classes = [IsPerson]
    serializer_class = ExportSerializer

    def get_queryset(self):
        return selectors.volumes_visible_to(Actor.from_request(self.request)).order_by("id")

    @extend_schema(request=ExportSerializer, responses={202: dict, 400: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def export(self, request, pk=None):
        """202 with the export job's id: `{"job", "volume", "destination", "archive"}`; the
        tar lands at `<destination><job>/<attempt>/volume.tar` once the job succeeded."""
        volume = self.get_object()
        body = ExportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        destination = body.validated_data["destination"]
        job_body = volume_export.export_body(
            volume=volume, destination=destination, user=request.user
        )
        submit = JobSubmitSerializer(data=job_body, context={"request": request})
        if not submit.is_valid():
            raise ValidationError(volume_export.field_errors(submit.errors))
        job = volume_export.volume_export(
            volume=volume, submit=dict(submit.validated_data), actor=Actor.from_request(request)
        )
        answer = {
            "job": job.pk,
            "volume": volume.pk,
            "destination": job.output_destination,
            "archive": volume_export.ARCHIVE,
        }
        return Response(answer, status=status.HTTP_202_ACCEPTED)
