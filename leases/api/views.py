"""/api/v1/compute-leases: reserve, commit, renew, release; GET the leases you may see.

People act on their tenants' leases (operators on all); a node's agent only on leases of its
own node (`Lease.objects.visible_to`). Leases of others are 404, never 403.
"""

import copy
import json
import threading
import time
from datetime import timedelta

import orjson
from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from leases import selectors, services
from leases.api.serializers import (
    FencedSerializer,
    LeaseCreateSerializer,
    LeaseEventSerializer,
    LeaseSerializer,
    ReleaseSerializer,
    RenewSerializer,
    UsageSerializer,
    idempotency_key,
)
from leases.models import Lease
from pools.actors import Actor
from pools.api.permissions import (
    IsNodeOrOperator,
    IsOperator,
    IsPerson,
    IsPersonOrNode,
    TokenScopeAllows,
)
from pools.api.throttles import TokenThrottle, check_lease_rate
from pools.models import ComputePool, Membership, ResourceShape, Tenant
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

# Validated create bodies per (user, body), for a few seconds: the tenant-membership lookup
# (and the pool and catalogue-shape lookups) of a repeated request body are not redone on every
# reserve. A membership removed (or a shape changed) takes effect within this TTL in every
# process; only valid bodies are cached, so a bad body always gets the serializer's field errors.
CREATE_CACHE_SECONDS = 5.0
_CREATE_MAX_ENTRIES = 10_000
_create_cache: dict[tuple, tuple[float, dict]] = {}
_create_lock = threading.Lock()
_clock = time.monotonic  # tests move it forward


@receiver([post_save, post_delete], sender=Membership)
@receiver([post_save, post_delete], sender=Tenant)
@receiver([post_save, post_delete], sender=ComputePool)
@receiver([post_save, post_delete], sender=ResourceShape)
def forget_validated_bodies(**kwargs) -> None:
    """In this process a change is seen at once; in the others within CREATE_CACHE_SECONDS."""
    with _create_lock:
        _create_cache.clear()


def _body_key(user_id, data: dict) -> tuple | None:
    """The cache key of a body: its canonical JSON (sorted keys). orjson takes a tenth of
    json.dumps's time, but writes NaN and ±Infinity as null; a body whose JSON has a null (or
    one of those) takes json.dumps's key instead, so two different bodies never share one."""
    try:
        text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        if b"null" not in text:
            return (user_id, text)
        return (user_id, json.dumps(data, sort_keys=True, separators=(",", ":")))
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError: not cached
        return None


def validated_create_body(request) -> dict:
    """LeaseCreateSerializer's validated data for this request (cached as described above)."""
    data, user = request.data, request.user
    key = None
    ttl = getattr(settings, "LEASE_CREATE_CACHE_SECONDS", CREATE_CACHE_SECONDS)
    if ttl > 0 and isinstance(data, dict) and user.pk is not None:
        key = _body_key(user.pk, data)
    now = _clock()
    if key is not None:
        hit = _create_cache.get(key)
        if hit is not None and now - hit[0] < ttl:
            return {**hit[1], "request": copy.deepcopy(hit[1]["request"])}
    serializer = LeaseCreateSerializer(data=data, context={"request": request})
    serializer.is_valid(raise_exception=True)
    validated = serializer.validated_data
    if key is not None:
        with _create_lock:
            if len(_create_cache) >= _CREATE_MAX_ENTRIES:
                _create_cache.clear()
            _create_cache[key] = (
                now,
                {**validated, "request": copy.deepcopy(validated["request"])},
            )
    return validated


class LeaseViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = LeaseSerializer
    permission_classes = [IsPersonOrNode]
    throttle_classes = [TokenThrottle]  # reserves only (pools/api/throttles.py)
    filterset_fields = {
        "state": ["exact", "in"],
        "tenant__slug": ["exact"],
        "pool__slug": ["exact"],
    }

    def get_permissions(self):
        if self.action == "create":
            return [IsPerson()]
        if self.action == "usage":
            return [IsNodeOrOperator()]
        if self.action in ("accounting",):
            return [IsPerson()]
        return [IsPersonOrNode()]

    def get_queryset(self):
        return selectors.leases_visible_to(Actor.from_request(self.request))

    @extend_schema(request=LeaseCreateSerializer, responses={201: LeaseSerializer})
    def create(self, request, *args, **kwargs):
        key = idempotency_key(request)
        data = validated_create_body(request)
        check_lease_rate(data["tenant"])  # once the tenant is known to be the requester's own
        window = data.get("window")
        lease = services.lease_reserve(
            pool=data["pool"],
            tenant=data["tenant"],
            request=data["request"],
            actor=Actor.from_request(request),
            duration=timedelta(seconds=data["duration_s"]),
            idempotency_key=key,
            window=(
                services.Window(
                    window["start"], window["end"], timedelta(seconds=window["tolerance_s"])
                )
                if window
                else None
            ),
        )
        return Response(LeaseSerializer(lease).data, status=status.HTTP_201_CREATED)

    def _lease(self):
        return self.get_object()

    def _fenced_lease(self, body) -> Lease:
        """The lease, and for a node's agent only with its fencing token (release and usage,
        as commit and renew): a stale attempt on the node cannot end or report its successor."""
        lease = self._lease()
        if Actor.from_request(self.request).is_node:
            token = body.validated_data.get("fencing_token")
            if token is None:
                raise ValidationError({"fencing_token": ["A node sends its lease's token."]})
            if token != lease.fencing_token:
                raise TransitionRefused(
                    "fencing_token_mismatch",
                    "Stale fencing token: another attempt holds this lease.",
                )
        return lease

    @extend_schema(request=FencedSerializer, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def commit(self, request, pk=None):
        body = FencedSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        lease = services.lease_commit(
            lease=self._lease(),
            fencing_token=body.validated_data["fencing_token"],
            actor=Actor.from_request(request),
        )
        return Response(LeaseSerializer(lease).data)

    @extend_schema(request=RenewSerializer, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def renew(self, request, pk=None):
        body = RenewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        seconds = body.validated_data.get("duration_s") or int(
            settings.LEASE_DEFAULT_TTL.total_seconds()
        )
        lease = services.lease_renew(
            lease=self._lease(),
            fencing_token=body.validated_data["fencing_token"],
            actor=Actor.from_request(request),
            duration=timedelta(seconds=seconds),
        )
        return Response(LeaseSerializer(lease).data)

    @extend_schema(request=ReleaseSerializer, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        body = ReleaseSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        lease = services.lease_release(
            lease=self._fenced_lease(body),
            actor=Actor.from_request(request),
            reason=Reason.RELEASED_BY_CLIENT,
            message=body.validated_data["message"],
        )
        return Response(LeaseSerializer(lease).data)

    @extend_schema(request=UsageSerializer, responses=LeaseSerializer)
    @action(detail=True, methods=["post"])
    def usage(self, request, pk=None):
        body = UsageSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        usage = {k: v for k, v in body.validated_data.items() if k != "fencing_token"}
        lease = services.lease_report_usage(
            lease=self._fenced_lease(body), actor=Actor.from_request(request), **usage
        )
        return Response(LeaseSerializer(lease).data)

    @extend_schema(responses=LeaseEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)  # a plain list
    def events(self, request, pk=None):
        return Response(LeaseEventSerializer(self._lease().events.all(), many=True).data)

    @extend_schema(responses={200: {"type": "array", "items": {"type": "object"}}})
    @action(detail=False, methods=["get"], pagination_class=None)  # a plain list
    def accounting(self, request):
        """Held vs consumed for each tenant you may see (?tenant=slug&pool=slug to narrow)."""
        tenants = Tenant.objects.visible_to(Actor.from_request(request))
        if request.query_params.get("tenant"):
            tenants = tenants.filter(slug=request.query_params["tenant"])
        pool = None
        if request.query_params.get("pool"):
            pool = get_object_or_404(ComputePool, slug=request.query_params["pool"])
        return Response([selectors.tenant_accounting(t, pool) for t in tenants.order_by("slug")])


@extend_schema(responses={200: dict})
@api_view(["GET"])
@permission_classes([IsOperator, TokenScopeAllows])
def pool_capacity(request, slug):
    """Operators: allocatable, reserved, used, free, fragmented, draining, unhealthy."""
    pool = get_object_or_404(ComputePool, slug=slug)
    return Response(selectors.pool_capacity(pool))
