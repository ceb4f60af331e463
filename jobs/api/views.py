from hashlib import sha256
from urllib.parse import urlencode

import orjson
from django.http import Http404, HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from jobs import artifacts, selectors, services
from jobs.api.downloads import output_response
from jobs.api.serializers import (
    JobEventSerializer,
    JobOutputSerializer,
    JobSerializer,
    JobSubmitSerializer,
)
from jobs.trace import parse_traceparent
from leases.api.serializers import idempotency_key
from pools import logcontext
from pools.actors import Actor
from pools.api.permissions import IsPerson
from pools.api.throttles import PlacementThrottle, TokenThrottle
from pools.choices import TokenScope
from pools.reasons import Reason
from pools.selectors import tenant_data_readable
from pools.statemachine import Refusal
from pools.validation import BIGINT_MAX

EVENTS_MAX = 1000


def _query_int(request, name: str, default: int, *, minimum: int, maximum: int | None = None):
    """An integer query parameter, or a 400 naming it."""
    field = serializers.IntegerField(min_value=minimum, max_value=maximum)
    try:
        return field.run_validation(request.query_params.get(name, str(default)))
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({name: exc.detail}) from None


class SupportGrantRequired(PermissionDenied):
    default_detail = (
        "Operators read a tenant's logs and outputs only under a support grant from one of "
        "its admins (POST /api/v1/tenants/{slug}/support-grants)."
    )
    default_code = "support_grant_required"


class TraceContextMixin:
    """A view that binds `pools.logcontext.trace_id` for the request it serves (a request about
    one job): whatever it bound is unbound when the request is done, so a server thread's next
    request does not inherit it."""

    def dispatch(self, request, *args, **kwargs):
        token = logcontext.trace_id.set(logcontext.trace_id.get())
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            logcontext.trace_id.reset(token)


class JobViewSet(TraceContextMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    permission_classes = [IsPerson]
    # submit and explain only: per token (TokenThrottle), per tenant (see placement_tenant)
    throttle_classes = [TokenThrottle, PlacementThrottle]
    serializer_class = JobSerializer
    required_scope = None  # read or write by method; logs and outputs set their own
    filterset_fields = {
        "state": ["exact", "in"],
        "tenant__slug": ["exact"],
        "pool__slug": ["exact"],
    }

    def get_queryset(self):
        jobs = selectors.jobs_visible_to(Actor.from_request(self.request))
        return jobs.prefetch_related("leases") if self.action == "list" else jobs

    def placement_tenant(self, request):
        """The tenant a submit counts against (PlacementThrottle), checked to be the requester's
        own before anything else (the image is resolved later); None: validation refuses it."""
        if self.action == "explain":  # a placement search too: counted against the job's tenant
            pk = str(self.kwargs.get("pk", ""))
            job = self.get_queryset().filter(pk=pk).first() if pk.isdigit() else None
            return job.tenant if job else None
        slug = request.data.get("tenant") if isinstance(request.data, dict) else None
        if self.action != "create" or not isinstance(slug, str):
            return None
        try:
            return JobSubmitSerializer(context={"request": request}).validate_tenant(slug)
        except serializers.ValidationError:
            return None

    @extend_schema(
        request=JobSubmitSerializer, responses={201: JobSerializer, 422: dict, 429: dict}
    )
    def create(self, request, *args, **kwargs):
        """Submit a job. With an `Idempotency-Key` header, a retry with the same key and the
        same body gets the first job back (201, nothing new queued); the same key with another
        body is 422 `idempotency_key_reused`. A valid W3C `traceparent` header makes the job
        join the client's trace (its span the parent); an invalid or absent one starts a new
        trace (docs/observability.md "Traces")."""
        key = idempotency_key(request)
        serializer = JobSubmitSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        if key:
            digest = orjson.dumps(request.data, option=orjson.OPT_SORT_KEYS)
            data |= {"idempotency_key": key, "idempotency_digest": sha256(digest).hexdigest()}
        # a shape that never fits raises NeverFits: the same 422 body as POST /compute-leases
        data["trace"] = parse_traceparent(request.headers.get("traceparent"))
        job = services.job_submit(actor=Actor.from_request(request), **data)
        logcontext.trace_id.set(job.trace_id)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.job_cancel(job=self.get_object(), actor=Actor.from_request(request))
        return Response(JobSerializer(job).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Cursor: only events after this event id"),
            OpenApiParameter("limit", int, description=f"At most this many (1..{EVENTS_MAX})"),
        ],
        responses=JobEventSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=None)  # a list; its cursor: Link
    def events(self, request, pk=None):
        """The job's events, oldest first, as a list. Cursor-paginated: a page that is not the
        last carries `Link: <…?after=ID&limit=N>; rel="next"`; a client that follows the job
        live (the websocket) asks `?after=` the last id it saw to fetch what it missed."""
        after = _query_int(request, "after", 0, minimum=0, maximum=BIGINT_MAX)
        limit = _query_int(request, "limit", EVENTS_MAX, minimum=1, maximum=EVENTS_MAX)
        events = list(self.get_object().events.filter(pk__gt=after).order_by("pk")[: limit + 1])
        response = Response(JobEventSerializer(events[:limit], many=True).data)
        if len(events) > limit:
            query = urlencode({"after": events[limit - 1].pk, "limit": limit})
            response["Link"] = f'<{request.build_absolute_uri(request.path)}?{query}>; rel="next"'
        return response

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def trace(self, request, pk=None):
        """The job's trace: its spans in order, derived from its events (submit, scheduling,
        node admission, image pull, container start, running, result upload, the end; per
        attempt). Operators also see each span's infrastructure attributes."""
        job = self.get_object()
        logcontext.trace_id.set(job.trace_id)
        return Response(selectors.job_trace(job, Actor.from_request(request)))

    @extend_schema(responses=dict)
    @action(detail=True, methods=["get"])
    def explain(self, request, pk=None):
        """Why the job waits (its reason from the last pass, and the scheduler's answer now), or
        why it runs where it does (the placement's decision record)."""
        return Response(selectors.job_explanation(self.get_object()))

    def data_object(self):
        """The job whose logs or outputs are read: visible, and its tenant's data readable by
        the caller (an operator: only under a support grant), checked on every read."""
        job = self.get_object()
        if not tenant_data_readable(Actor.from_request(self.request), job.tenant_id):
            raise SupportGrantRequired()
        return job

    @extend_schema(
        parameters=[OpenApiParameter("tail", int, description="Last N lines (1..10000)")],
        responses={(200, "text/plain"): str},
    )
    @action(detail=True, methods=["get"], required_scope=TokenScope.LOGS_READ)
    def logs(self, request, pk=None):
        """The job's log as text: its last `tail` lines (default 1000), every attempt."""
        lines = _query_int(request, "tail", 1000, minimum=1, maximum=artifacts.LOG_TAIL_MAX_LINES)
        text = artifacts.job_log_tail(self.data_object(), lines)
        return HttpResponse(text, content_type="text/plain; charset=utf-8")

    @extend_schema(responses=JobOutputSerializer(many=True))
    @action(
        detail=True,
        methods=["get"],
        pagination_class=None,  # a plain list
        required_scope=TokenScope.OUTPUTS_READ,
    )
    def outputs(self, request, pk=None):
        """The files the newest attempt wrote to /outputs: name, size, sha256."""
        outputs = artifacts.job_outputs(self.data_object())
        return Response(JobOutputSerializer(outputs, many=True).data)

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    @action(
        detail=True,
        methods=["get"],
        url_path=r"outputs/(?P<name>[^/]+)",
        required_scope=TokenScope.OUTPUTS_READ,
    )
    def output_file(self, request, pk=None, name=None):
        """One output file of the newest attempt, as an attachment."""
        output = artifacts.job_outputs(self.data_object()).filter(name=name).first()
        if output is None:
            raise Http404("This job has no output of this name.")
        if output.location:  # in the tenant's own bucket (jobs/object_store.py)
            raise Refusal(
                f"This output is in the tenant's bucket at {output.location} (size and sha256 "
                "in the outputs list): fetch it from there with the tenant's own credentials.",
                code=Reason.OUTPUT_IN_OBJECT_STORE,
                extra={"location": output.location},
            )
        response = output_response(
            output, filename=output.name, content_type="application/octet-stream"
        )
        response["X-Content-Type-Options"] = "nosniff"
        return response
