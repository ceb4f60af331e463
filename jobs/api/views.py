from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from jobs import selectors, services
from jobs.api.serializers import JobEventSerializer, JobSerializer, JobSubmitSerializer
from pools.actors import Actor
from pools.api.permissions import IsPerson


class JobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsPerson]
    serializer_class = JobSerializer
    filterset_fields = {
        "state": ["exact", "in"],
        "tenant__slug": ["exact"],
        "pool__slug": ["exact"],
    }

    def get_queryset(self):
        return selectors.jobs_visible_to(Actor.from_request(self.request))

    @extend_schema(request=JobSubmitSerializer, responses={201: JobSerializer, 422: dict})
    def create(self, request, *args, **kwargs):
        serializer = JobSubmitSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        # a shape that never fits raises NeverFits: the same 422 body as POST /compute-leases
        job = services.job_submit(actor=Actor.from_request(request), **data)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.job_cancel(job=self.get_object(), actor=Actor.from_request(request))
        return Response(JobSerializer(job).data)

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        events = self.get_object().events.all()
        return Response(JobEventSerializer(events, many=True).data)
