"""Node transitions are published on commit to operators, who follow them at /ws/nodes/; like
the node API, nobody else may follow nodes."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from config.builders import SYSTEM, build_node, build_pool
from nodes import services
from pools.consumers import NOTHING_TO_FOLLOW
from pools.reasons import Reason
from tests.live_events import followed, own_channel_layer, refused

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def node(db):
    return build_node(build_pool("events"), "gpu-1", cpu=16000, memory=65536)


def quarantine(node):
    return services.node_quarantine(node=node, actor=SYSTEM, message="flaky NIC")


def test_a_node_transition_reaches_operators(node, operator):
    async def scenario():
        every_node = await followed(operator, "/ws/nodes/")
        this_node = await followed(operator, f"/ws/nodes/{node.pk}/")
        await database_sync_to_async(quarantine)(node)
        for socket in (every_node, this_node):
            event = await socket.receive_json_from(timeout=5)
            assert (event["node"], event["name"], event["pool"]) == (node.pk, "gpu-1", node.pool_id)
            assert (event["from"], event["to"]) == ("ready", "quarantined")
            assert (event["reason"], event["message"]) == (Reason.QUARANTINED, "flaky NIC")
            await socket.disconnect()

    with own_channel_layer():
        async_to_sync(scenario)()


def test_a_node_is_published_from_its_registration(operator):
    pool = build_pool("fresh")

    async def scenario():
        socket = await followed(operator, "/ws/nodes/")
        await database_sync_to_async(build_node)(pool, "cpu-9", cpu=8000, memory=16384)
        states = [(await socket.receive_json_from(timeout=5))["to"] for _ in range(3)]
        assert states == ["registered", "verified", "ready"]
        await socket.disconnect()

    with own_channel_layer():
        async_to_sync(scenario)()


def test_only_operators_may_follow_nodes(node, person, member):
    async def scenario():
        for user in (person, member):
            assert await refused(user, "/ws/nodes/") == NOTHING_TO_FOLLOW
            assert await refused(user, f"/ws/nodes/{node.pk}/") == NOTHING_TO_FOLLOW

    with own_channel_layer():
        async_to_sync(scenario)()
