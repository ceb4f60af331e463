"""The agent's drain callback: it wrote the checkpoint a drain deadline asked for. Beside the
node's own agent endpoints (nodes/api/views.py) on the same /api/v1/agent/ prefix, but here
because it acts on the job and its leases (scheduling/drain.py)."""

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from jobs.models import Job
from leases.api.serializers import FencedSerializer
from nodes.api.views import NodeErrorsMixin
from nodes.errors import NodeScopeRefused
from pools.actors import Actor
from pools.api.permissions import IsNode
from scheduling.drain import agent_job_checkpointed


class AgentDrainViewSet(NodeErrorsMixin, viewsets.GenericViewSet):
    """Acts on jobs placed on the asking node and nothing else."""

    permission_classes = [IsNode]

    @extend_schema(request=FencedSerializer, responses={200: dict})
    @action(detail=False, methods=["post"], url_path=r"jobs/(?P<job_id>\d+)/checkpointed")
    def job_checkpointed(self, request, job_id=None):
        body = FencedSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise NodeScopeRefused(f"job {job_id} holds no lease on this node")
        actor = Actor.from_request(request)
        job = agent_job_checkpointed(
            node=actor.node,
            job=job,
            actor=actor,
            fencing_token=body.validated_data["fencing_token"],
        )
        return Response({"job": job.pk, "state": job.state})
