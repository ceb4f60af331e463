"""Issue 17, live channel: a browser's websocket that waits idle stays open and gets the next
event, through the real web server process (as `make run` starts it, with its header and
keep-alive timeouts) and the real Redis channel layer (channels_redis with redis-py 8, as
config/settings.py configures it). Before, redis-py 8's 5 s default read timeout raced
channels_redis's 5 s BZPOPMIN and every idle socket was closed within seconds (1011,
`TimeoutError: Timeout reading from`)."""

import asyncio
import json

import pytest
import websockets
from channels.db import database_sync_to_async
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.test import Client

from config.builders import SYSTEM, submit_job
from jobs.services import job_cancel
from tests.live_events import own_channel_layer
from tests.web_server import web_server

IDLE_S = 90


def test_the_layer_reads_longer_than_its_blocking_pop():
    (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    assert host["address"] == settings.REDIS_URL
    assert host["socket_timeout"] > RedisChannelLayer.brpop_timeout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_idle_socket_stays_open_and_gets_the_next_event(pool, tenant, member):
    job = submit_job(pool, tenant, "idle")
    browser = Client()
    browser.force_login(member)
    cookie = f"sessionid={browser.cookies['sessionid'].value}"

    async def scenario(url):
        async with websockets.connect(
            f"{url.replace('http', 'ws')}/ws/jobs/{job.pk}/",
            origin=url,
            additional_headers={"Cookie": cookie},
            ping_interval=None,  # like a browser: it only answers the server's pings
        ) as socket:
            await asyncio.sleep(IDLE_S)  # the consumer waits on Redis all this time
            await database_sync_to_async(job_cancel)(job=job, actor=SYSTEM, message="after a wait")
            # a socket the server closed while idle raises ConnectionClosedError here
            return await asyncio.wait_for(socket.recv(), 10)

    with own_channel_layer():  # this test's events only, on the shared Redis
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        with web_server(CHANNEL_LAYER_PREFIX=prefix) as url:
            event = json.loads(asyncio.run(scenario(url)))
    assert (event["job"], event["state"], event["message"]) == (job.pk, "cancelled", "after a wait")
