"""Resumable live events (pools/consumers.py) through the real web server process and the real
Redis channel layer: a client that signs in with an API token follows /ws/jobs/, loses its
connection, and picks up with `?after=<cursor>` every event it missed, each once, in order."""

import asyncio
import json
import logging
import threading
from datetime import timedelta
from urllib.parse import urlsplit

import psycopg
import pytest
import websockets
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from config.builders import SYSTEM, build_token, submit_job
from config.drill.proxy import Proxy
from config.routing import websocket_urlpatterns
from jobs.models import JobEvent
from jobs.services import job_cancel
from pools import consumers
from pools.choices import PlatformRole
from pools.consumers import AWAY, BAD_CURSOR, FOLLOWING_CHANGED, NOT_SIGNED_IN, NOTHING_TO_FOLLOW
from pools.models import ApiToken, Membership, token_digest
from pools.services import api_token_revoke, member_remove, platform_role_grant
from tests.live_events import own_channel_layer
from tests.web_server import _test_database_url, web_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def server():
    with own_channel_layer():  # this test's events only, on the shared Redis
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        with web_server(CHANNEL_LAYER_PREFIX=prefix) as url:
            yield url.replace("http", "ws")


def connect(url: str, token: str, path: str = "/ws/jobs/"):
    return websockets.connect(
        f"{url}{path}", additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10
    )


async def receive(socket, count: int, timeout: float = 10) -> list[dict]:
    return [json.loads(await asyncio.wait_for(socket.recv(), timeout)) for _ in range(count)]


def start_cursor(pool, tenant) -> int:
    """The cursor of a fresh event: earlier tests' rows are gone, and their ids would be gaps
    that the socket waits on (while another test database holds a transaction open)."""
    submit_job(pool, tenant, "marker")
    return JobEvent.objects.latest("id").pk


def visible_events(tenant, after: int) -> list[tuple]:
    rows = JobEvent.objects.filter(job__tenant=tenant, id__gt=after).order_by("id")
    return list(rows.values_list("id", "job_id", "to_state"))


def seen(events: list[dict]) -> list[tuple]:
    return [(e["cursor"], e["job"], e["to"]) for e in events]


def test_a_client_that_reconnects_with_its_cursor_sees_every_event_once_in_order(
    server, pool, tenant, other_tenant, member
):
    token = build_token(member)
    start = start_cursor(pool, other_tenant)
    first = [submit_job(pool, tenant, f"before-{i}") for i in range(3)]
    submit_job(pool, other_tenant, "not-theirs")

    async def scenario():
        async with connect(server, token, f"/ws/jobs/?after={start}") as socket:
            events = await receive(socket, 3)  # the history first: three submits
            live = asyncio.to_thread(job_cancel, job=first[0], actor=SYSTEM, message="live")
            await live
            events += await receive(socket, 1)
        # disconnected: these happen meanwhile, another tenant's among them
        await asyncio.to_thread(job_cancel, job=first[1], actor=SYSTEM)
        later = await asyncio.to_thread(submit_job, pool, tenant, "while-away")
        await asyncio.to_thread(submit_job, pool, other_tenant, "still-not-theirs")
        async with connect(server, token, f"/ws/jobs/?after={events[-1]['cursor']}") as socket:
            events += await receive(socket, 2)  # the cancel and the submit it missed
            await asyncio.to_thread(job_cancel, job=later, actor=SYSTEM)
            events += await receive(socket, 1)  # then live again
            with pytest.raises(TimeoutError):  # nothing else: no repeat, no other tenant
                await asyncio.wait_for(socket.recv(), 1)
        return events

    events = asyncio.run(scenario())
    assert seen(events) == visible_events(tenant, start)
    assert [e["state"] for e in events[3:]] == ["cancelled", "cancelled", "queued", "cancelled"]
    assert events[3]["message"] == "live" and events[3]["name"] == "before-0"


def test_replay_and_live_meet_without_gap_or_repeat_while_jobs_keep_changing(
    server, pool, tenant, member
):
    """Events are committed all through the reconnects: whatever the switch from the
    database's history to the live feed, the client sees the tenant's events exactly, once
    each, in order."""
    token = build_token(member)
    start = start_cursor(pool, tenant)

    def churn():
        for i in range(30):
            job_cancel(job=submit_job(pool, tenant, f"churn-{i}"), actor=SYSTEM)
        connection.close()

    async def scenario():
        writer = threading.Thread(target=churn)
        writer.start()
        events = []
        while True:  # a new connection every 7 events, until one hears nothing for a second
            after = events[-1]["cursor"] if events else start
            async with connect(server, token, f"/ws/jobs/?after={after}") as socket:
                while True:
                    try:
                        events.append(json.loads(await asyncio.wait_for(socket.recv(), 1)))
                    except TimeoutError:
                        if not writer.is_alive():
                            return events
                        break
                    if len(events) % 7 == 0:  # drop the connection mid-stream
                        break

    events = asyncio.run(scenario())
    assert len(events) == 60
    assert seen(events) == visible_events(tenant, start)


def test_an_event_committed_late_with_a_lower_id_is_not_skipped(server, pool, tenant, member):
    """Ids are given at insert, rows become visible at commit: a transaction that holds an
    earlier id commits after a later one. The socket waits for it rather than skip it."""
    token = build_token(member)
    held_job, other_job = submit_job(pool, tenant, "held"), submit_job(pool, tenant, "quick")
    table = JobEvent._meta.db_table

    async def scenario():
        async with connect(server, token) as socket:  # no cursor: from now on
            with psycopg.connect(_test_database_url()) as held:  # a transaction left open
                held.execute(
                    f"INSERT INTO {table} (at, actor_kind, actor_label, from_state, to_state, "
                    "reason, message, data, job_id) VALUES (now(), 'system', 'system:test', "
                    "'queued', 'cancelled', 'cancelled_by_user', 'held', '{}', %s)",
                    [held_job.pk],
                )
                await asyncio.to_thread(job_cancel, job=other_job, actor=SYSTEM)  # a later id
                with pytest.raises(TimeoutError):  # not sent past the id still missing
                    await asyncio.wait_for(socket.recv(), 1.5)
            # the held transaction commits on leaving the block
            return await receive(socket, 2)

    events = asyncio.run(scenario())
    assert [e["job"] for e in events] == [held_job.pk, other_job.pk]
    assert events[0]["message"] == "held"
    assert events[0]["cursor"] < events[1]["cursor"]


def test_a_socket_without_cursor_gets_an_event_committing_as_it_connects_and_nothing_older(
    server, pool, tenant, member
):
    """Without `after` a socket starts past the newest committed event; an event whose
    transaction was still open then (its id lower) commits after the socket connected: it is
    sent, in cursor order before the next live one, and the events committed before the
    socket connected are not."""
    token = build_token(member)
    held_job, quick_job = submit_job(pool, tenant, "held"), submit_job(pool, tenant, "quick")
    later_job = submit_job(pool, tenant, "later")
    table = JobEvent._meta.db_table

    async def scenario():
        with psycopg.connect(_test_database_url()) as held:  # a transaction left open
            held.execute(
                f"INSERT INTO {table} (at, actor_kind, actor_label, from_state, to_state, "
                "reason, message, data, job_id) VALUES (now(), 'system', 'system:test', "
                "'queued', 'cancelled', 'cancelled_by_user', 'in flight', '{}', %s)",
                [held_job.pk],
            )
            await asyncio.to_thread(job_cancel, job=quick_job, actor=SYSTEM)  # a later id
            socket = await connect(server, token)  # no cursor: from now on
        # the held transaction has committed on leaving the block, after the connect
        async with socket:
            await asyncio.to_thread(job_cancel, job=later_job, actor=SYSTEM)
            events = await receive(socket, 2)
            with pytest.raises(TimeoutError):  # not the quick job's: it came before
                await asyncio.wait_for(socket.recv(), 1.5)
        return events

    events = asyncio.run(scenario())
    assert [(e["job"], e["message"]) for e in events] == [
        (held_job.pk, "in flight"),
        (later_job.pk, "cancelled"),
    ]
    assert events[0]["cursor"] < events[1]["cursor"]


HELD_S = 12  # longer than the 10 s after which the socket once gave up on a missing id


def test_an_event_whose_transaction_stays_open_long_is_still_sent_in_order(
    server, pool, tenant, member
):
    """A transaction holds an earlier id open for longer than any fixed wait while a later
    event commits: the socket sends neither until it commits, then both, in id order."""
    token = build_token(member)
    held_job, other_job = submit_job(pool, tenant, "held"), submit_job(pool, tenant, "quick")
    table = JobEvent._meta.db_table

    async def scenario():
        async with connect(server, token) as socket:
            with psycopg.connect(_test_database_url()) as held:
                held.execute(
                    f"INSERT INTO {table} (at, actor_kind, actor_label, from_state, to_state, "
                    "reason, message, data, job_id) VALUES (now(), 'system', 'system:test', "
                    "'queued', 'cancelled', 'cancelled_by_user', 'held long', '{}', %s)",
                    [held_job.pk],
                )
                await asyncio.to_thread(job_cancel, job=other_job, actor=SYSTEM)
                with pytest.raises(TimeoutError):  # nothing past the open transaction's id
                    await asyncio.wait_for(socket.recv(), HELD_S)
            return await receive(socket, 2)

    events = asyncio.run(scenario())
    assert [e["job"] for e in events] == [held_job.pk, other_job.pk]
    assert events[0]["message"] == "held long"
    assert events[0]["cursor"] < events[1]["cursor"]


def close_code(url: str, token: str, path: str) -> int:
    async def scenario():
        async with connect(url, token, path) as socket:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), 5)
        return closed.value.rcvd.code

    return asyncio.run(scenario())


def test_a_bad_cursor_or_token_is_refused_with_a_clear_code(server, member, pool, tenant):
    token = build_token(member)
    assert close_code(server, token, "/ws/jobs/?after=yesterday") == BAD_CURSOR
    assert close_code(server, token, "/ws/jobs/?after=-3") == BAD_CURSOR
    assert close_code(server, token, "/ws/jobs/?after=%D9%A1") == BAD_CURSOR  # Arabic-Indic 1
    assert close_code(server, token, "/ws/jobs/?after=%EF%BC%97") == BAD_CURSOR  # fullwidth 7
    submit_job(pool, tenant, "newest")  # ids above the newest one given are no cursor yet
    newest = JobEvent.objects.latest("id").pk
    assert close_code(server, token, f"/ws/jobs/?after={newest + 1000}") == BAD_CURSOR
    assert close_code(server, token, f"/ws/jobs/?after={10**17}") == BAD_CURSOR
    assert close_code(server, "cpu_not-a-token", "/ws/jobs/") == NOT_SIGNED_IN
    write_only = build_token(member, scopes=["write"])
    assert close_code(server, write_only, "/ws/jobs/") == NOTHING_TO_FOLLOW
    expired = build_token(member, name="expired")
    ApiToken.objects.filter(digest=token_digest(expired)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert close_code(server, expired, "/ws/jobs/") == NOT_SIGNED_IN


def test_an_open_socket_closes_once_its_token_is_revoked_or_its_person_deactivated(
    server, member, tenant_admin
):
    """The sign-in is checked again at the consumer's periodic read (pools.consumers.POLL_S,
    5 s): a token revoked, or its person deactivated, while the socket is open closes it with
    4401 within about that, as the API would refuse its next request."""
    revoked, deactivated = build_token(member), build_token(tenant_admin)

    async def closed_with(socket) -> int:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(socket.recv(), 7)
        return closed.value.rcvd.code

    async def scenario():
        async with connect(server, revoked) as first, connect(server, deactivated) as second:
            token = await asyncio.to_thread(ApiToken.objects.get, digest=token_digest(revoked))
            await asyncio.to_thread(api_token_revoke, token=token)
            await asyncio.to_thread(
                type(tenant_admin).objects.filter(pk=tenant_admin.pk).update, is_active=False
            )
            return await asyncio.gather(closed_with(first), closed_with(second))

    assert asyncio.run(scenario()) == [NOT_SIGNED_IN, NOT_SIGNED_IN]


def test_an_open_socket_follows_what_its_person_may_follow_now(server, member, tenant_admin):
    """Memberships and roles are read again at the same periodic check: a member removed from
    the tenant is closed with 4403 (nothing to follow any more); a member made an operator with
    4409, to reconnect and follow the stream whole."""
    removed, promoted = build_token(member), build_token(tenant_admin)

    async def closed_with(socket) -> int:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(socket.recv(), 7)
        return closed.value.rcvd.code

    def change():
        member_remove(membership=Membership.objects.get(user=member), actor=SYSTEM)
        platform_role_grant(user=tenant_admin, role=PlatformRole.OPERATOR)

    async def scenario():
        async with connect(server, removed) as first, connect(server, promoted) as second:
            await asyncio.to_thread(change)
            return await asyncio.gather(closed_with(first), closed_with(second))

    assert asyncio.run(scenario()) == [NOTHING_TO_FOLLOW, FOLLOWING_CHANGED]


def test_a_session_still_needs_an_allowed_origin(server, member):
    """Without a token, a handshake from another site's page is refused before any consumer
    runs (the browser would send the person's cookie there too)."""

    async def scenario():
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"{server}/ws/jobs/", origin="https://evil.example"):
                pass
        return refused.value.response.status_code

    assert asyncio.run(scenario()) == 403


# --- Redis away: the documented 1011, never a dropped socket ------------------------------------


async def _open(user, path: str = "/ws/jobs/") -> WebsocketCommunicator:
    """A socket to `path` as `user` (signed in, as the session middleware makes it): an
    exception inside the consumer is raised here, as the server would log it. Run under
    async_to_sync: the consumer's database work then uses the test's own connection."""
    socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    socket.scope["user"] = user
    accepted, _ = await socket.connect(timeout=10)
    assert accepted
    return socket


def test_while_redis_is_away_a_connect_is_closed_with_1011(member, caplog):
    """Joining the socket's groups fails: the client gets the close code it reconnects on
    (docs/api.md "Live events"), not a dropped socket and a traceback in the server's log."""

    async def scenario():
        socket = await _open(member, "/ws/jobs/?after=0")
        return await socket.receive_output(timeout=10)

    dead = own_channel_layer(hosts=["redis://127.0.0.1:1/0"])  # nothing listens there
    with dead, caplog.at_level(logging.WARNING, logger="pools.consumers"):
        closed = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": AWAY}
    assert "a store is away" in caplog.text


def test_redis_going_away_under_an_open_socket_closes_it_with_1011(pool, tenant, member):
    """The socket follows through a link to Redis that is then cut (config/drill/proxy.py's
    partition): it ends with 1011, and once Redis answers again a reconnect with the last
    cursor gets what happened meanwhile."""
    redis = urlsplit(settings.REDIS_URL)

    async def scenario():
        proxy = Proxy([(redis.hostname, redis.port or 6379)])
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with own_channel_layer(hosts=[f"redis://127.0.0.1:{port}/{redis.path[1:] or 0}"]):
                socket = await _open(member)
                await database_sync_to_async(submit_job)(pool, tenant, "seen")
                first = await socket.receive_json_from(timeout=10)
                proxy.set_cut(True)
                closed = await socket.receive_output(timeout=20)
                missed = await database_sync_to_async(submit_job)(pool, tenant, "while-away")
                proxy.set_cut(False)
                again = await _open(member, f"/ws/jobs/?after={first['cursor']}")
                later = await again.receive_json_from(timeout=10)
                await again.disconnect()
        finally:
            server.close()
        return first, closed, missed, later

    first, closed, missed, later = async_to_sync(scenario)()
    assert first["name"] == "seen"
    assert closed == {"type": "websocket.close", "code": AWAY}
    assert (later["job"], later["state"]) == (missed.pk, "queued")


# --- the cost and reach of a replay -----------------------------------------------------------


def _bulk_events(job, count: int) -> list[int]:
    JobEvent.objects.bulk_create(
        JobEvent.build(
            job, actor=SYSTEM, from_state="queued", to_state="queued", reason="submitted"
        )
        for _ in range(count)
    )
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("id", flat=True))


def test_a_cursor_older_than_the_replay_window_is_refused(member, pool, tenant, monkeypatch):
    """A replay reaches back at most pools.consumers.REPLAY_WINDOW event ids: an older cursor is
    refused with 4400 (docs/api.md), a client reads the history over the API instead."""
    monkeypatch.setattr(consumers, "REPLAY_WINDOW", 50)
    job = submit_job(pool, tenant, "history")
    ids = _bulk_events(job, 60)

    async def scenario(after: int):
        socket = await _open(member, f"/ws/jobs/{job.pk}/?after={after}")
        if await socket.receive_nothing(timeout=1):
            await socket.disconnect()
            return None
        return (await socket.receive_output(timeout=5)).get("code")

    with own_channel_layer():
        assert async_to_sync(scenario)(ids[0]) == BAD_CURSOR
        assert async_to_sync(scenario)(ids[-1]) is None  # within the window: it follows


def test_a_replay_reads_only_what_the_socket_may_send(member, pool, tenant, other_tenant):
    """`?after=` far behind on one job's socket, with thousands of other tenants' events in
    between: the job's event comes in a few reads, not one read per 500 ids of the table."""
    start = start_cursor(pool, tenant)
    _bulk_events(submit_job(pool, other_tenant, "theirs"), 5000)
    mine = submit_job(pool, tenant, "mine")

    async def scenario():
        socket = await _open(member, f"/ws/jobs/{mine.pk}/?after={start}")
        event = await socket.receive_json_from(timeout=10)
        await socket.disconnect()
        return event

    table = JobEvent._meta.db_table
    with own_channel_layer(), CaptureQueriesContext(connection) as queries:
        event = async_to_sync(scenario)()
    assert (event["job"], event["state"]) == (mine.pk, "queued")
    reads = [q["sql"] for q in queries.captured_queries if table in q["sql"]]
    assert len(reads) <= 10, reads  # it was 22: one read of ids and one of rows per 500 ids
