"""A console page left open and idle (issue 22): served by hypercorn with the settings `make run`
uses (config/hypercorn.py: a 10 s keep-alive deadline for headers, pings every 20 s), a job's
page held open for 90 s without a single event never shows "reconnecting", and the next event
still arrives on the socket it opened with."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket

import pytest
from channels.testing.live import make_application
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.db import connections
from playwright.sync_api import expect

from tests.browser import chromium_page, sign_in

from .conftest import _fresh_child_after_fork

pytestmark = [pytest.mark.docker, pytest.mark.browser]

IDLE_S = 90


def _serve(port: int, ready) -> None:
    """The forked child: the ASGI application under hypercorn, configured as `make run` is."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    _fresh_child_after_fork()
    config = Config.from_object("config.hypercorn")
    config.bind = [f"127.0.0.1:{port}"]
    application = make_application(static_wrapper=ASGIStaticFilesHandler)
    ready.set()
    asyncio.run(serve(application, config))


@pytest.fixture(scope="module")
def hypercorn_console(stack, django_db_blocker):
    with django_db_blocker.unblock():
        connections.close_all()  # the forked server must not share this process's connection
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    server = context.Process(target=_serve, args=(port, ready), daemon=True)
    server.start()
    assert ready.wait(30), "hypercorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.join(10)


def test_a_page_idle_for_90_s_stays_connected_and_hears_the_next_event(stack, hypercorn_console):
    response = stack.submit("idle", ["sh", "-c", "echo late"])
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    with chromium_page() as page:
        sign_in(page, hypercorn_console, "e2e-alice", "pw-e2e-alice")
        page.goto(f"{hypercorn_console}/console/jobs/{job_id}")
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
        page.wait_for_timeout(IDLE_S * 1000)
        assert page.evaluate("window.liveStates") == []
        stack.drive(job_id, "succeeded")
        expect(page.locator("#timeline li[data-reason=exited_zero]")).to_have_count(1)
        assert page.evaluate("window.liveStates") == []  # the events came on the first socket
