"""The websocket side of live events (pools/events.py): one consumer class per stream, each a
subclass naming its `stream` and `model`, routed at /ws/<stream>/ (the whole stream as the API
lists it to this person) and /ws/<stream>/<pk>/ (one object the API shows them).

Resumable: every event sent carries its `cursor`, the id of its event row, and a client that
connects with `?after=<cursor>` first gets every event after it that it may see, in order, then
the live ones. The database is the source of truth: a message on the consumer's groups only
wakes it up (and a timer does, in case a publish was lost), and it sends what the event table
holds past the last row it sent, so the switch from replay to live can neither skip nor repeat.
"""

import asyncio
import contextlib
import logging
import time
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError, InterfaceError, connection
from django.urls import path
from django.utils import timezone
from redis.exceptions import RedisError

from .actors import Actor
from .choices import TokenScope
from .events import event_fields, subscriptions

log = logging.getLogger(__name__)

BAD_CURSOR = 4400  # `after` is not an event id
NOT_SIGNED_IN = 4401  # no session, or a bearer token that is unknown, expired or revoked
NOTHING_TO_FOLLOW = 4403  # not found and not yours look the same; a token without `read` too
AWAY = 1011  # Redis (the channel layer) or the database away: reconnect with the last cursor
# What a store that is away raises: redis-py's errors, a socket's, the database driver's.
AWAY_ERRORS = (RedisError, OSError, DatabaseError, InterfaceError)

BATCH = 500  # rows read at a time
POLL_S = 5.0  # read even without a wake-up: a publish lost while Redis was away
GAP_RETRY_S = 0.2
# An id missing below a committed one belongs to a transaction still running (it will commit
# later, out of id order) or to one rolled back. The consumer waits there until every
# transaction running when it saw the gap has ended, and never longer than this.
GAP_WAIT_S = 10.0
OLD_GAP_S = 60.0
# The subject's fields each event names besides the subject's id, when its model has them.
SUBJECT_FIELDS = ("name", "tenant", "pool", "node", "job")


def parse_cursor(query_string: bytes) -> int | None:
    """The `after` of a query string: None when absent; ValueError when it is not an id."""
    values = parse_qs(query_string.decode("latin-1")).get("after")
    if not values:
        return None
    if len(values) != 1 or not values[0].isdigit() or len(values[0]) > 18:
        raise ValueError(values)
    return int(values[0])


class EventsConsumer(AsyncJsonWebsocketConsumer):
    stream: str = ""
    model = None

    @classmethod
    def routes(cls) -> list:
        return [
            path(f"ws/{cls.stream}/", cls.as_asgi()),
            path(f"ws/{cls.stream}/<int:pk>/", cls.as_asgi()),
        ]

    async def __call__(self, scope, receive, send):
        """Channels' consumer loop, with a store that is away (joining the groups, waiting on
        them, reading the events at connect) ending the socket with AWAY, a close code the
        client reconnects on, instead of an exception that the server answers by dropping the
        socket (and a traceback in its log)."""
        said = []  # what was said of the socket's end: accepted, closed, the client gone

        async def tracked_receive():
            message = await receive()
            if message["type"] == "websocket.disconnect":
                said.append("gone")
            return message

        async def tracked_send(message):
            if message["type"] in ("websocket.accept", "websocket.close"):
                said.append(message["type"])
            await send(message)

        try:
            await super().__call__(scope, tracked_receive, tracked_send)
        except AWAY_ERRORS as error:
            if sender := getattr(self, "sender", None):
                sender.cancel()
            if "gone" in said or "websocket.close" in said:
                return  # the socket has ended already: nothing to tell the client
            log.warning("live events: a store is away (%r); the socket closes with %s", error, AWAY)
            if "websocket.accept" not in said:  # a close before the accept is a bare 1006
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": AWAY})

    async def connect(self):
        self.groups_joined = []
        actor = Actor.for_user(self.scope.get("user"))
        if not actor.is_person:
            await self._refuse(NOT_SIGNED_IN, "not signed in: no session, or a bad token")
            return
        self.token = self.scope.get("token")
        if self.token is not None and not self.token.allows(TokenScope.READ):
            await self._refuse(NOTHING_TO_FOLLOW, "this token lacks the read scope")
            return
        try:
            after = parse_cursor(self.scope.get("query_string", b""))
        except ValueError:
            await self._refuse(BAD_CURSOR, "after: give the cursor of an event (an integer)")
            return
        self.actor = actor
        self.pk = self.scope["url_route"]["kwargs"].get("pk")
        groups = await database_sync_to_async(subscriptions)(
            self.stream, self.model, actor, self.pk
        )
        if not groups:
            await self._refuse(NOTHING_TO_FOLLOW, "nothing to follow here")
            return
        # the groups first: an event committed from now on wakes this socket up
        self.groups_joined = groups
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.after = after if after is not None else await database_sync_to_async(self._newest)()
        self.gap = None  # (first missing id, xid it waits to see finished, since)
        self.wake = asyncio.Event()
        self.sender = asyncio.create_task(self._send_events())

    async def _refuse(self, code: int, reason: str) -> None:
        """Accepted, then closed with `code` at once (nothing is sent): a close before the
        accept reaches the browser as a bare 1006, like a server that is down, and the page
        could not tell a final refusal from a moment's trouble."""
        await self.accept()
        await self.close(code=code, reason=reason)

    async def disconnect(self, code):
        if sender := getattr(self, "sender", None):
            sender.cancel()
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def entity_event(self, message):
        self.wake.set()  # what to send comes from the database, in cursor order

    # --- reading the event table -----------------------------------------------------------

    @property
    def event_model(self):
        return self.model.events.rel.related_model

    async def _send_events(self):
        """Sends what the table holds past `self.after`, again on each wake-up or timer, until
        the socket closes; a failure (the database away) closes it with 1011, so the client
        reconnects with its cursor instead of waiting on a socket that no longer sends."""
        try:
            while True:
                self.wake.clear()
                if self.token is not None and self.token.expires_at <= timezone.now():
                    await self.close(code=NOT_SIGNED_IN, reason="the token expired")
                    return
                events, more = await database_sync_to_async(self._read)()
                for event in events:
                    await self.send_json(event)
                if more == "now":
                    continue
                wait = GAP_RETRY_S if more == "soon" else POLL_S
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)
        except asyncio.CancelledError:
            raise
        except Exception:
            await self.close(code=AWAY)

    def _newest(self) -> int:
        newest = self.event_model.objects.order_by("-id").values_list("id", flat=True).first()
        return newest or 0

    def _read(self) -> tuple[list[dict], str]:
        """The events this person may see past `self.after` up to the first id still missing
        (see GAP_WAIT_S), and whether to read again "now" (a full batch), "soon" (waiting at a
        gap) or at the next wake-up."""
        ids, ats, xmin, xmax = self._ids_after(self.after)
        horizon = self.after
        for event_id, at in zip(ids, ats, strict=True):
            if event_id != horizon + 1 and not self._gap_settled(horizon + 1, xmin, xmax, at):
                break
            horizon = event_id
        rows = self.event_model.objects.visible_to(self.actor).filter(
            id__gt=self.after, id__lte=horizon
        )
        if self.pk is not None:
            rows = rows.filter(**{f"{self.event_model.subject_field}_id": self.pk})
        subject = self.event_model.subject_field
        events = [self._payload(row) for row in rows.select_related(subject).order_by("id")]
        self.after = horizon
        if ids and horizon != ids[-1]:
            return events, "soon"
        return events, "now" if len(ids) == BATCH else "later"

    def _ids_after(self, after: int) -> tuple[list[int], list[float], int, int]:
        """Every committed id past `after` (anyone's) and its event's time, with the
        transactions running now: the oldest one's xid and the next xid to be given (one
        statement, so one snapshot)."""
        if connection.vendor != "postgresql":  # SQLite: one writer, ids commit in order
            rows = self.event_model.objects.filter(id__gt=after).order_by("id")
            ids = list(rows.values_list("id", flat=True)[:BATCH])
            return ids, [time.time()] * len(ids), 0, 0
        table = connection.ops.quote_name(self.event_model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(array_agg(id ORDER BY id), '{}'), "
                "coalesce(array_agg(extract(epoch FROM at)::float ORDER BY id), '{}'), "
                "pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
                "pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
                f"FROM (SELECT id, at FROM {table} WHERE id > %s ORDER BY id LIMIT %s) AS e",
                [after, BATCH],
            )
            return cursor.fetchone()

    def _gap_settled(self, missing: int, xmin: int, xmax: int, next_at: float) -> bool:
        """Whether the id `missing` will never commit: every transaction that was running when
        this consumer first saw it missing has ended (it rolled back), or GAP_WAIT_S passed, or
        the event after it is older than OLD_GAP_S (history: no transaction lasts that long)."""
        if time.time() - next_at > OLD_GAP_S:
            return True
        if self.gap is None or self.gap[0] != missing:
            self.gap = (missing, xmax, time.monotonic())
        _, waits_for, since = self.gap
        return xmin >= waits_for or time.monotonic() - since > GAP_WAIT_S

    def _payload(self, row) -> dict:
        subject = getattr(row, row.subject_field)
        payload = {row.subject_field: subject.pk}
        for name in SUBJECT_FIELDS:
            if name == row.subject_field or not _has_field(type(subject), name):
                continue
            field = type(subject)._meta.get_field(name)
            payload[name] = getattr(subject, field.attname)
        return {**payload, "state": row.to_state, **event_fields(row), "cursor": row.pk}


def _has_field(model, name: str) -> bool:
    return any(f.name == name and f.concrete for f in model._meta.get_fields())
