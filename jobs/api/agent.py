"""The agent's job endpoints (docs/data-plane.md), node credential only: its assignments, the
steps it reports, the logs and outputs it uploads. Beside nodes' agent endpoints and the drain
callback on the same /api/v1/agent/ prefix; each acts only on jobs placed on the asking node."""

import hashlib
import logging

from django.core.exceptions import ValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from jobs import artifacts, assignments, lifecycle, object_store
from jobs.api.downloads import EncryptionUnavailable, output_response
from jobs.api.views import TraceContextMixin
from jobs.models import Job
from jobs.services import job_volume_gone
from jobs.trace import parse_traceparent
from leases.choices import HOLDING
from nodes.api.views import NodeErrorsMixin
from nodes.errors import NodeScopeRefused
from nodes.signatures import upload_digest
from pools import logcontext, validation
from pools.actors import Actor
from pools.api.parsers import TextJSONParser
from pools.api.permissions import IsNode
from pools.encryption import EncryptionError
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

logger = logging.getLogger(__name__)

FENCING_TOKEN = r"^[0-9]{1,19}$"
PORTS_MAX = 16
OUTPUT_FILES_MAX = 64  # files in one upload


class RouteSerializer(serializers.Serializer):
    host = serializers.CharField(max_length=253)
    ports = serializers.DictField(
        child=serializers.IntegerField(min_value=1, max_value=65535), default=dict
    )

    def validate_ports(self, value):
        if len(value) > PORTS_MAX:
            raise serializers.ValidationError(f"At most {PORTS_MAX} ports.")
        for port in value:
            if not str(port).isdigit() or not 1 <= int(port) <= 65535:
                raise serializers.ValidationError(f"{str(port)[:8]!r} is not a port number.")
        return {str(int(port)): host_port for port, host_port in value.items()}


class SkippedOutputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255, allow_blank=True, trim_whitespace=False)
    reason = serializers.ChoiceField(choices=lifecycle.OUTPUT_SKIP_REASONS)


class ReportSerializer(serializers.Serializer):
    fencing_token = serializers.RegexField(FENCING_TOKEN)
    step = serializers.ChoiceField(choices=lifecycle.STEPS)
    reason = serializers.ChoiceField(
        choices=sorted(lifecycle.FAILURES | {Reason.IMAGE_PULLING, Reason.IMAGE_PULLED}),
        required=False,
        allow_blank=True,
        default="",
    )
    exit_code = serializers.IntegerField(
        min_value=-(2**31), max_value=2**31 - 1, required=False, allow_null=True, default=None
    )
    message = serializers.CharField(
        max_length=1000, required=False, allow_blank=True, default="", trim_whitespace=False
    )
    route = RouteSerializer(required=False, allow_null=True, default=None)
    pull_seconds = serializers.FloatField(
        min_value=0, max_value=86400, required=False, allow_null=True, default=None
    )
    # what the agent did not upload of /outputs, with the end of the attempt
    outputs_skipped = serializers.ListField(
        child=SkippedOutputSerializer(),
        max_length=lifecycle.OUTPUTS_SKIPPED_MAX,
        required=False,
        default=list,
    )
    outputs_skipped_total = serializers.IntegerField(
        min_value=0, max_value=2**31 - 1, required=False, allow_null=True, default=None
    )
    # seconds from the container's exit to this report: the log and outputs uploaded meanwhile
    upload_seconds = serializers.FloatField(
        min_value=0, max_value=86400, required=False, allow_null=True, default=None
    )

    def validate(self, data):
        if data["step"] == "failed":
            if data["reason"] not in lifecycle.FAILURES:
                raise serializers.ValidationError(
                    {"reason": f"A failure is one of {', '.join(sorted(lifecycle.FAILURES))}."}
                )
            if data["reason"] == Reason.EXITED_NONZERO and not data["exit_code"]:
                raise serializers.ValidationError({"exit_code": "The non-zero exit code."})
        elif data["step"] != "pulling" and data["reason"]:
            raise serializers.ValidationError({"reason": "Only a failure or a pull has one."})
        if data["outputs_skipped"] and data["step"] not in lifecycle.END_STEPS:
            raise serializers.ValidationError({"outputs_skipped": "Only the end of an attempt."})
        if data["upload_seconds"] is not None and data["step"] not in lifecycle.END_STEPS:
            raise serializers.ValidationError({"upload_seconds": "Only the end of an attempt."})
        if data["step"] == "succeeded" and data["exit_code"] not in (None, 0):
            raise serializers.ValidationError({"exit_code": "A success exits with 0."})
        return data


class LogSerializer(serializers.Serializer):
    fencing_token = serializers.RegexField(FENCING_TOKEN)
    text = serializers.CharField(
        max_length=artifacts.LOG_CHUNK_MAX_BYTES, allow_blank=True, trim_whitespace=False
    )


class OutputsSerializer(serializers.Serializer):
    fencing_token = serializers.RegexField(FENCING_TOKEN)
    files = serializers.ListField(
        child=serializers.FileField(max_length=255, allow_empty_file=True),
        min_length=1,
        max_length=OUTPUT_FILES_MAX,
    )


class ObjectOutputSerializer(serializers.Serializer):
    """One output file for the job's s3:// destination (jobs/object_store.py)."""

    fencing_token = serializers.RegexField(FENCING_TOKEN)
    name = serializers.CharField(max_length=255, trim_whitespace=False)
    size = serializers.IntegerField(min_value=0, max_value=object_store.OUTPUT_MAX_BYTES)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")

    def validate_name(self, value):
        try:
            validation.file_name(value)
        except ValidationError as error:
            raise serializers.ValidationError(error.messages) from None
        return value


class AgentJobsViewSet(TraceContextMixin, NodeErrorsMixin, viewsets.GenericViewSet):
    """Acts on jobs placed on the asking node and nothing else."""

    permission_classes = [IsNode]
    serializer_class = ReportSerializer

    def initial(self, request, *args, **kwargs):
        """A request about one job binds the job's own trace id for the request's log lines,
        once the node is authenticated and the job found placed on it. The agent sends its
        assignment's `traceparent` back; a header that names another trace is never trusted
        (config/request_id.py may have bound it for the request): the job's own replaces it."""
        super().initial(request, *args, **kwargs)
        job_id = kwargs.get("job_id")
        if job_id and str(job_id).isdigit():
            trace_id = self.placed_job(job_id).trace_id
            logcontext.trace_id.set(trace_id)
            context = parse_traceparent(request.headers.get("traceparent"))
            if context is not None and context[0] != trace_id:
                logger.info("job %s: a traceparent of another trace was ignored", job_id)

    def actor(self) -> Actor:
        return Actor.from_request(self.request)

    def placed_job(self, job_id) -> Job:
        """A job that holds or held a lease on this node (its visibility for a node)."""
        job = Job.objects.visible_to(self.actor()).filter(pk=job_id).distinct().first()
        if job is None:
            raise NodeScopeRefused(f"job {job_id} holds no lease on this node")
        return job

    @extend_schema(request=None, responses={200: dict})
    @action(detail=False, methods=["get"])
    def assignments(self, request):
        api_base = request.build_absolute_uri("/").rstrip("/")
        return Response(assignments.node_assignments(node=self.actor().node, api_base=api_base))

    @extend_schema(request=None, responses={(200, "application/x-tar"): bytes})
    @action(detail=False, methods=["get"], url_path=r"jobs/(?P<job_id>\d+)/checkpoint")
    def checkpoint(self, request, job_id=None):
        """The newest checkpoint.tar of an earlier attempt, for the attempt that restores it:
        only the node holding the job's current lease may read it."""
        job = self.placed_job(job_id)
        lease = job.leases.filter(state__in=HOLDING).order_by("-id").first()
        if lease is None or lease.node_id != self.actor().node.pk:
            raise NodeScopeRefused(f"job {job.pk}'s current lease is not on this node")
        checkpoint = assignments.job_checkpoint(job)
        if checkpoint is None:
            raise NotFound("This job has no checkpoint of an earlier attempt.")
        return output_response(
            checkpoint, filename=assignments.CHECKPOINT_OUTPUT, content_type="application/x-tar"
        )

    @extend_schema(request=ReportSerializer, responses={200: dict})
    @action(detail=False, methods=["post"], url_path=r"jobs/(?P<job_id>\d+)/report")
    def report(self, request, job_id=None):
        job = self.placed_job(job_id)
        serializer = ReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        actor = self.actor()
        try:
            job = lifecycle.job_report(
                job=job, node=actor.node, actor=actor, **serializer.validated_data
            )
        except TransitionRefused as refused:  # its start refused: a volume it mounts is gone
            if refused.code == Reason.VOLUME_GONE:
                job_volume_gone(job_id=job.pk, actor=actor, message=refused.message)
            raise
        return Response({"job": job.pk, "state": job.state, "attempts": job.attempts})

    @extend_schema(request=LogSerializer, responses={200: dict})
    @action(
        detail=False,
        methods=["post"],
        url_path=r"jobs/(?P<job_id>\d+)/logs",
        parser_classes=[TextJSONParser],  # a NUL the job printed is U+FFFD, not a 400
    )
    def logs(self, request, job_id=None):
        job = self.placed_job(job_id)
        serializer = LogSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        lifecycle.upload_lease(job, self.actor().node, data["fencing_token"])
        chunk = artifacts.job_log_append(job=job, attempt=job.attempts, text=data["text"])
        return Response({"job": job.pk, "seq": chunk.seq if chunk else None})

    @extend_schema(request=OutputsSerializer, responses={201: dict})
    @action(detail=False, methods=["post"], url_path=r"jobs/(?P<job_id>\d+)/outputs")
    def outputs(self, request, job_id=None):
        job = self.placed_job(job_id)
        data = {
            "fencing_token": request.data.get("fencing_token"),
            "files": request.FILES.getlist("files"),
        }
        serializer = OutputsSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        lifecycle.upload_lease(job, self.actor().node, serializer.validated_data["fencing_token"])
        names = {}
        for upload in serializer.validated_data["files"]:  # all checked before any is stored
            try:
                validation.file_name(upload.name)
            except ValidationError as error:
                names[upload.name[:255]] = error.messages
        if names:
            raise serializers.ValidationError({"files": names})
        _check_upload_digest(request, serializer.validated_data["files"])
        stored = []
        for upload in serializer.validated_data["files"]:
            try:
                output = artifacts.job_output_store(
                    job=job, attempt=job.attempts, name=upload.name, fileobj=upload
                )
            except ValidationError as error:
                raise serializers.ValidationError(
                    {"files": {upload.name[:255]: error.messages}}
                ) from error
            except EncryptionError as error:  # no ring: nothing is stored unencrypted
                logger.error("job %s: output not stored: %s", job.pk, error)
                raise EncryptionUnavailable() from None
            stored.append({"name": output.name, "size": output.size, "sha256": output.sha256})
        return Response({"job": job.pk, "outputs": stored}, status=201)

    def _object_output(self, request, job_id):
        job = self.placed_job(job_id)
        serializer = ObjectOutputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        lifecycle.upload_lease(job, self.actor().node, data.pop("fencing_token"))
        return job, data

    @extend_schema(request=ObjectOutputSerializer, responses={200: dict})
    @action(detail=False, methods=["post"], url_path=r"jobs/(?P<job_id>\d+)/outputs/presign")
    def output_presign(self, request, job_id=None):
        """A presigned PUT of one output to the job's s3:// destination: {url, headers (each
        signed in: send them as given), location}. Never the bucket's credentials."""
        job, data = self._object_output(request, job_id)
        return Response(object_store.output_presign(job=job, attempt=job.attempts, **data))

    @extend_schema(request=ObjectOutputSerializer, responses={201: dict})
    @action(detail=False, methods=["post"], url_path=r"jobs/(?P<job_id>\d+)/outputs/record")
    def output_record(self, request, job_id=None):
        """Records an output PUT by its presigned URL once a HEAD shows its size and sha256
        (409 `output_mismatch` otherwise, the object removed)."""
        job, data = self._object_output(request, job_id)
        output = object_store.output_record(job=job, attempt=job.attempts, **data)
        body = {"name": output.name, "size": output.size, "sha256": output.sha256}
        return Response({"job": job.pk, "output": body | {"location": output.location}}, 201)


def _check_upload_digest(request, files) -> None:
    """A streamed upload is signed over its file's SHA-256 (`Upload-Digest`,
    nodes/signatures.py) instead of its body: the one file it carries must have that digest
    before anything of it is stored."""
    declared = upload_digest(request)
    if declared is None:
        return  # signed over the whole body, already checked
    if len(files) != 1:
        raise serializers.ValidationError({"files": ["A signed streamed upload carries one file."]})
    digest = hashlib.sha256()
    for chunk in files[0].chunks():
        digest.update(chunk)
    files[0].seek(0)
    if digest.hexdigest() != declared:
        raise serializers.ValidationError(
            {"files": {files[0].name[:255]: ["The file is not the one the signature names."]}}
        )
