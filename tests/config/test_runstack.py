"""`make run` without Redis: the embedded Redis-protocol server carries both real clients."""

import asyncio

from celery import Celery
from channels_redis.core import RedisChannelLayer

from config.management.commands.runstack import _redis_answers, start_embedded_redis


def test_embedded_redis_serves_the_channel_layer_and_the_celery_broker():
    url = start_embedded_redis()
    assert _redis_answers(url)

    async def live_event_round_trip():
        layer = RedisChannelLayer(hosts=[url])
        channel = await layer.new_channel()
        await layer.group_add("tenant-1", channel)
        await layer.group_send("tenant-1", {"type": "job.event", "event": {"job": 7}})
        return await asyncio.wait_for(layer.receive(channel), 5)

    assert asyncio.run(live_event_round_trip())["event"] == {"job": 7}
    with Celery(broker=url).connection() as connection:
        queue = connection.SimpleQueue("computepool-test")
        queue.put({"task": "scheduling.pass"})
        assert queue.get(timeout=5).payload == {"task": "scheduling.pass"}
        queue.close()


def test_an_unreachable_redis_is_detected():
    assert not _redis_answers("redis://127.0.0.1:1/0")
