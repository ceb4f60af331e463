"""`GET /api/v1/agent/assignments/wait?timeout=25`: the agent's long poll for a push
(docs/data-plane.md "Assignments", nodes/push.py). It answers `{"changed": true}` as soon as
the asking node is nudged, `{"changed": false}` at the timeout, and never the assignments
themselves: the agent then reads `GET agent/assignments`, so fencing, secrets and stopping
entries stay that endpoint's alone.

An async Django view, served by the ASGI app like every URL: a sync (DRF) view that waited
would hold one of the server's threads for the whole wait. The credential, the permission,
the throttles and the error shape are the other agent endpoints' (a DRF view run through
sync_to_async, `WaitCheck`); the database connection it used is given back before the wait,
so a waiting agent holds a Redis subscription and nothing else.
"""

from __future__ import annotations

import logging

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection
from django.http import JsonResponse
from django.views import View
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from nodes.push import WAIT_DEFAULT_S, WAIT_MAX_S, WAIT_MIN_S, wait_for_push
from pools.actors import Actor
from pools.api.errors import error_body
from pools.api.permissions import IsNode

logger = logging.getLogger(__name__)


class WaitSerializer(serializers.Serializer):
    timeout = serializers.FloatField(
        min_value=WAIT_MIN_S, max_value=WAIT_MAX_S, default=WAIT_DEFAULT_S
    )


class WaitCheck(APIView):
    """Who is asking and for how long, as DRF answers it for the other agent endpoints."""

    permission_classes = [IsNode]

    def get(self, request):
        serializer = WaitSerializer(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        node = Actor.from_request(request).node
        return Response({"node": node.pk, "timeout": serializer.validated_data["timeout"]})


_check_view = WaitCheck.as_view()


def _check(request):
    response = _check_view(request)
    response.render()
    if not connection.in_atomic_block:  # (a test's transaction stays open)
        close_old_connections()  # not held while the request waits
    return response


class AssignmentsWaitView(View):
    http_method_names = ["get"]

    async def get(self, request):
        response = await sync_to_async(_check)(request)
        if response.status_code != 200:
            return response
        node_id, timeout = response.data["node"], response.data["timeout"]
        try:
            changed = await wait_for_push(node_id, timeout)
        except Exception:
            logger.warning(
                "assignments wait of node %s: channel layer failed", node_id, exc_info=True
            )
            body = error_body("push_unavailable", "No push now: read the assignments by polling.")
            return JsonResponse(body, status=503)
        return JsonResponse({"changed": changed})


assignments_wait = AssignmentsWaitView.as_view()
