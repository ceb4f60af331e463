"""Issue 17, live channel: a browser's websocket that waits idle stays open and gets the next
event, through the real web server process (as `make run` starts it, with its header and
keep-alive timeouts) and the real Redis channel layer (channels_redis with redis-py 8, as
config/settings.py configures it). Before, redis-py 8's 5 s default read timeout raced
channels_redis's 5 s BZPOPMIN and every idle socket was closed within seconds (1011,
`TimeoutError: Timeout reading from`).

Issue 22, the console page left open: in headless Chromium, a job's page held open and idle for
the same 90 s (hypercorn as `make run` configures it, config/hypercorn.py: a 10 s keep-alive
deadline for headers, pings every 20 s) never shows "reconnecting", and the next event still
arrives on the socket it opened with. Both wait in the same 90 s: one idle period, two sockets.
"""

import asyncio
import json
import threading

import pytest
import websockets
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.test import Client
from playwright.sync_api import expect

from config.builders import SYSTEM, submit_job
from jobs.services import job_cancel
from tests.browser import chromium_page
from tests.live_events import own_channel_layer
from tests.web_server import web_server

IDLE_S = 90


def test_the_layer_reads_longer_than_its_blocking_pop():
    (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    assert host["address"] == settings.REDIS_URL
    assert host["socket_timeout"] > RedisChannelLayer.brpop_timeout


class IdleSocket(threading.Thread):
    """A script's websocket to a job (its own thread and event loop: Playwright's sync API holds
    the test's): it opens, waits without sending anything until told the event was sent, then
    reads it. A socket the server closed while idle raises ConnectionClosedError at that read."""

    def __init__(self, url: str, job_id: int, cookie: str):
        super().__init__(daemon=True)
        self.url, self.job_id, self.cookie = url, job_id, cookie
        self.opened, self.sent = threading.Event(), threading.Event()
        self.received: str | None = None
        self.error: BaseException | None = None

    def run(self):
        try:
            self.received = asyncio.run(self.scenario())
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.opened.set()

    async def scenario(self) -> str:
        async with websockets.connect(
            f"{self.url.replace('http', 'ws')}/ws/jobs/{self.job_id}/",
            origin=self.url,
            additional_headers={"Cookie": self.cookie},
            ping_interval=None,  # like a browser: it only answers the server's pings
        ) as socket:
            self.opened.set()
            # the consumer waits on Redis all this time; this loop answers the server's pings
            await asyncio.to_thread(self.sent.wait, 3 * IDLE_S)
            return await asyncio.wait_for(socket.recv(), 10)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_an_idle_socket_and_an_idle_page_stay_open_and_get_the_next_event(pool, tenant, member):
    job = submit_job(pool, tenant, "idle")
    browser = Client()
    browser.force_login(member)
    session = browser.cookies["sessionid"].value
    cookie = f"sessionid={session}"

    with own_channel_layer():  # this test's events only, on the shared Redis
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        # DEBUG as `make run` sets it: the server serves the console's static files itself
        with web_server(CHANNEL_LAYER_PREFIX=prefix, DEBUG="true") as url:
            script = IdleSocket(url, job.pk, cookie)
            script.start()
            assert script.opened.wait(30) and script.error is None, script.error
            with chromium_page() as page:
                # signed in by the session cookie (the server's own password hashers are not
                # the tests' fast one, so a sign-in form would refuse the test's password)
                page.context.add_cookies([{"name": "sessionid", "value": session, "url": url}])
                page.goto(f"{url}/console/jobs/{job.pk}")
                live = page.locator("[data-live-socket]")
                expect(live).to_have_attribute("data-live-state", "open")
                # every state the page's live indicator takes from here on
                page.evaluate(
                    """() => {
                      window.liveStates = [];
                      const el = document.querySelector('[data-live-socket]');
                      new MutationObserver(() => window.liveStates.push(el.dataset.liveState))
                        .observe(el, {attributes: true, attributeFilter: ['data-live-state']});
                    }"""
                )
                page.wait_for_timeout(IDLE_S * 1000)  # both sockets idle, the script's longer
                assert page.evaluate("window.liveStates") == []
                job_cancel(job=job, actor=SYSTEM, message="after a wait")
                script.sent.set()
                expect(page.locator("#timeline li[data-reason=cancelled_by_user]")).to_have_count(1)
                assert page.evaluate("window.liveStates") == []  # on the page's first socket
            script.join(30)
    assert script.error is None, repr(script.error)
    event = json.loads(script.received)
    assert (event["job"], event["state"], event["message"]) == (job.pk, "cancelled", "after a wait")
