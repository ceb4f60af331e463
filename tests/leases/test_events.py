"""Lease transitions are published on commit: a tenant's members and operators follow them at
/ws/leases/, with the lease API's visibility."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser

from config.builders import SYSTEM, cpu_request
from leases import services
from pools.consumers import NOT_SIGNED_IN, NOTHING_TO_FOLLOW
from pools.reasons import Reason
from tests.live_events import followed, own_channel_layer, refused

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lease(lpool, ltenant, lnode):
    return services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=cpu_request(),
        actor=SYSTEM,
        duration=timedelta(minutes=5),
    )


def release(lease):
    return services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)


def test_a_lease_transition_reaches_its_tenant_and_operators_not_another_tenant(
    lease, lmember, loperator, loutsider
):
    async def scenario():
        member = await followed(lmember, "/ws/leases/")
        operator = await followed(loperator, "/ws/leases/")
        outsider = await followed(loutsider, "/ws/leases/")
        one_lease = await followed(lmember, f"/ws/leases/{lease.pk}/")
        await database_sync_to_async(release)(lease)
        for socket in (member, operator, one_lease):
            event = await socket.receive_json_from(timeout=5)
            assert (event["lease"], event["tenant"], event["node"]) == (
                lease.pk,
                lease.tenant_id,
                lease.node_id,
            )
            assert (event["from"], event["to"], event["state"]) == (
                "reserved",
                "released",
                "released",
            )
            assert event["reason"] == Reason.RELEASED_BY_CLIENT
            assert event["actor"] == SYSTEM.label
        assert await outsider.receive_nothing(timeout=0.5)
        for socket in (member, operator, outsider, one_lease):
            await socket.disconnect()

    with own_channel_layer():
        async_to_sync(scenario)()


def test_following_one_lease_needs_the_api_to_show_it(lease, lmember, loutsider, loperator):
    async def scenario():
        assert await refused(lmember, f"/ws/leases/{lease.pk}/") is None
        assert await refused(loperator, f"/ws/leases/{lease.pk}/") is None
        assert await refused(loutsider, f"/ws/leases/{lease.pk}/") == NOTHING_TO_FOLLOW
        assert await refused(lmember, f"/ws/leases/{lease.pk + 1000}/") == NOTHING_TO_FOLLOW
        assert await refused(AnonymousUser(), "/ws/leases/") == NOT_SIGNED_IN

    with own_channel_layer():
        async_to_sync(scenario)()
