"""Node API: operators manage nodes and enrollment tokens; a node's agent, with its own
credential, reports on its own node only."""

from datetime import timedelta

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from nodes import selectors, services
from nodes.api.serializers import (
    AgentNodeSerializer,
    DrainSerializer,
    EnrollmentTokenSerializer,
    EnrollSerializer,
    HeartbeatSerializer,
    InventorySerializer,
    KeyRotationSerializer,
    MessageSerializer,
    NodeEventSerializer,
    NodeSerializer,
    ProbeResultSerializer,
    ProbeSerializer,
    QuarantineSerializer,
)
from nodes.authentication import NodeCredentialAuthentication
from nodes.errors import EnrollmentRefused, NodeScopeRefused
from nodes.models import Node
from nodes.services.mig import mig_layouts_open
from nodes.signatures import fingerprint_of, verify
from pools.actors import Actor
from pools.api.permissions import IsNode, IsNotNode, IsOperator
from pools.choices import TokenScope
from pools.models import token_digest


class NodeErrorsMixin:
    """Scope and enrollment refusals are 403s with a code."""

    def handle_exception(self, exc):
        if isinstance(exc, NodeScopeRefused | EnrollmentRefused):
            exc = PermissionDenied(detail=exc.message, code=exc.code)
        return super().handle_exception(exc)


def credential_body(credential, secret):
    return {
        "credential": secret,
        "credential_prefix": credential.prefix,
        "credential_expires_at": credential.expires_at,
    }


class EnrollmentTokenViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Operators create enrollment tokens for a pool; the secret is in the create response only."""

    serializer_class = EnrollmentTokenSerializer
    permission_classes = [IsOperator]
    required_scope = TokenScope.OPERATE

    def get_queryset(self):
        return selectors.enrollment_tokens_visible_to(Actor.from_request(self.request))

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, secret = services.enrollment_token_issue(
            pool=data["pool"],
            actor=Actor.from_request(request),
            max_uses=data["max_uses"],
            ttl=timedelta(hours=data["ttl_hours"]),
            name=data.get("name", ""),
        )
        body = EnrollmentTokenSerializer(token).data | {"secret": secret}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = services.enrollment_token_revoke(token=self.get_object())
        return Response(EnrollmentTokenSerializer(token).data)


class EnrollViewSet(NodeErrorsMixin, viewsets.GenericViewSet):
    """A node presents an enrollment token with its identity and inventory."""

    authentication_classes = [NodeCredentialAuthentication]  # only to refuse node credentials
    permission_classes = [IsNotNode]
    serializer_class = EnrollSerializer

    @extend_schema(request=EnrollSerializer, responses={201: dict})
    def create(self, request):
        request._request.body  # noqa: B018 (read first: the signature covers its digest)
        serializer = EnrollSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        public_key = data.pop("public_key")
        # proof of possession: the request is signed by the key it asks to bind
        verify(request._request, public_key=public_key, fingerprint=fingerprint_of(public_key))
        secret = data.pop("token")
        node, credential_secret, probe = services.node_enroll(
            secret=secret,
            name=data.pop("name"),
            inventory=data.pop("inventory"),
            public_key=public_key,
            **data,
        )
        credential = node.credentials.get(digest=token_digest(credential_secret))
        body = {
            "node": NodeSerializer(node).data,
            # the owner label and name prefix of the node's containers (runtime.base.Owner)
            "control_plane": selectors.control_plane_id(),
            "heartbeat_interval_s": node.pool.heartbeat_interval_s,
            "probes": ProbeSerializer([probe] if probe else [], many=True).data,
            **credential_body(credential, credential_secret),
        }
        return Response(body, status=status.HTTP_201_CREATED)


class AgentViewSet(NodeErrorsMixin, viewsets.GenericViewSet):
    """The agent side: everything acts on the asking node's own node and nothing else."""

    permission_classes = [IsNode]
    serializer_class = HeartbeatSerializer
    queryset = Node.objects.none()  # never listed: every action acts on the asking node

    def node(self):
        return Actor.from_request(self.request).node

    @extend_schema(request=None, responses=AgentNodeSerializer)
    @action(detail=False, methods=["get"])
    def me(self, request):
        return Response(AgentNodeSerializer(self.node()).data)

    @extend_schema(request=HeartbeatSerializer, responses={200: dict})
    @action(detail=False, methods=["post"])
    def heartbeat(self, request):
        serializer = HeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = services.node_heartbeat(
            node=self.node(), actor=Actor.from_request(request), **serializer.validated_data
        )
        probes = node.probes.filter(state="requested")
        return Response(
            {
                "state": node.state,
                "reachability": node.reachability,
                "heartbeat_interval_s": node.pool.heartbeat_interval_s,
                "drain_deadline": node.drain_deadline,
                "probes": ProbeSerializer(probes, many=True).data,
                # another MIG layout for an idle GPU (pools with mig_reconfiguration only)
                "mig_layouts": mig_layouts_open(node),
            }
        )

    @extend_schema(request=InventorySerializer, responses={202: dict})
    @action(detail=False, methods=["post"])
    def inventory(self, request):
        serializer = InventorySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = services.node_inventory_report(node=self.node(), inventory=serializer.validated_data)
        return Response(
            {"inventory_reported_at": node.inventory_reported_at}, status=status.HTTP_202_ACCEPTED
        )

    @extend_schema(responses=ProbeSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None)  # a plain list
    def probes(self, request):
        probes = self.node().probes.filter(state="requested")
        return Response(ProbeSerializer(probes, many=True).data)

    @extend_schema(request=ProbeResultSerializer, responses=ProbeSerializer)
    @action(detail=False, methods=["post"], url_path=r"probes/(?P<probe_id>\d+)/result")
    def probe_result(self, request, probe_id=None):
        serializer = ProbeResultSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        probe = get_object_or_404(self.node().probes.all(), pk=probe_id)
        probe = services.probe_result_submit(
            probe=probe, credential=request.auth, result=serializer.validated_data["result"]
        )
        return Response(ProbeSerializer(probe).data)

    @extend_schema(request=None, responses={201: dict})
    @action(detail=False, methods=["post"], url_path="credential/rotate")
    def rotate_credential(self, request):
        credential, secret = services.node_credential_rotate(
            credential=request.auth, actor=Actor.from_request(request)
        )
        return Response(credential_body(credential, secret), status=status.HTTP_201_CREATED)

    @extend_schema(request=KeyRotationSerializer, responses={200: dict})
    @action(detail=False, methods=["post"], url_path="key/rotate")
    def rotate_key(self, request):
        """The agent replaces its key: this request is signed by the old one, `proof` is the
        new one's signature over `compute-pool node-key-rotation <node id> <old fingerprint>
        <new fingerprint>`."""
        serializer = KeyRotationSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = services.node_key_rotate(
            node=self.node(), actor=Actor.from_request(request), **serializer.validated_data
        )
        return Response({"identity_fingerprint": node.identity_fingerprint})


class NodeViewSet(NodeErrorsMixin, viewsets.ReadOnlyModelViewSet):
    """Operators: nodes, why they are where they are, and the actions on them."""

    serializer_class = NodeSerializer
    permission_classes = [IsOperator]
    filterset_fields = {"pool__slug": ["exact"], "state": ["exact", "in"]}

    def get_queryset(self):
        return selectors.nodes_visible_to(Actor.from_request(self.request))

    def get_permissions(self):
        if self.action not in ("list", "retrieve", "events"):
            self.required_scope = TokenScope.OPERATE
        return super().get_permissions()

    def actor(self):
        return Actor.from_request(self.request)

    def _message(self, serializer_class=MessageSerializer):
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    @extend_schema(responses=NodeEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list
    def events(self, request, pk=None):
        return Response(NodeEventSerializer(self.get_object().events.all(), many=True).data)

    @extend_schema(request=DrainSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        data = self._message(DrainSerializer)
        node = services.node_drain(
            node=self.get_object(),
            actor=self.actor(),
            deadline=data.get("deadline"),
            message=data.get("message", ""),
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=MessageSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], url_path="cancel-drain")
    def cancel_drain(self, request, pk=None):
        data = self._message()
        node = services.node_drain_cancel(
            node=self.get_object(), actor=self.actor(), message=data.get("message", "")
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=QuarantineSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def quarantine(self, request, pk=None):
        data = self._message(QuarantineSerializer)
        node = services.node_quarantine(
            node=self.get_object(), actor=self.actor(), message=data["message"]
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=MessageSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        data = self._message()
        node = services.node_release(
            node=self.get_object(), actor=self.actor(), message=data.get("message", "")
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=MessageSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def retire(self, request, pk=None):
        data = self._message()
        node = services.node_retire(
            node=self.get_object(), actor=self.actor(), message=data.get("message", "")
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=MessageSerializer, responses={200: dict})
    @action(detail=True, methods=["post"], url_path="revoke-credentials")
    def revoke_credentials(self, request, pk=None):
        data = self._message()
        count = services.node_credentials_revoke(
            node=self.get_object(), actor=self.actor(), message=data.get("message", "")
        )
        return Response({"revoked": count})

    @extend_schema(request=None, responses={201: dict})
    @action(detail=True, methods=["post"], url_path="rotate-credential")
    def rotate_credential(self, request, pk=None):
        credential, secret = services.node_credential_reissue(
            node=self.get_object(), actor=self.actor()
        )
        return Response(credential_body(credential, secret), status=status.HTTP_201_CREATED)
