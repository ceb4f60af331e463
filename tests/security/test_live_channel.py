"""Issue 17, live channel: a websocket that waits idle on the real Redis channel layer
(channels_redis with redis-py 8, configured as config/settings.py does) stays open and gets the
next event. Before, redis-py 8's 5 s default read timeout raced channels_redis's 5 s BZPOPMIN
and every idle socket was closed within seconds (1011, `TimeoutError: Timeout reading from`)."""

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from config.builders import SYSTEM, submit_job
from jobs.services import job_cancel
from tests.live_events import followed, own_channel_layer

IDLE_S = 90


def test_the_layer_reads_longer_than_its_blocking_pop():
    (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    assert host["address"] == settings.REDIS_URL
    assert host["socket_timeout"] > RedisChannelLayer.brpop_timeout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_idle_socket_stays_open_and_gets_the_next_event(pool, tenant, member):
    job = submit_job(pool, tenant, "idle")

    async def scenario():
        socket = await followed(member, f"/ws/jobs/{job.pk}/")
        await asyncio.sleep(IDLE_S)  # the consumer waits on Redis all this time
        assert await socket.receive_nothing(timeout=0.1)
        await database_sync_to_async(job_cancel)(job=job, actor=SYSTEM, message="after a wait")
        # a consumer that died while idle raises its error here
        event = await socket.receive_json_from(timeout=10)
        assert (event["job"], event["state"], event["message"]) == (
            job.pk,
            "cancelled",
            "after a wait",
        )
        await socket.disconnect()

    with own_channel_layer():
        async_to_sync(scenario)()
