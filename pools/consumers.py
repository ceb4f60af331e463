"""The websocket side of live events (pools/events.py): one consumer class per stream, each a
subclass naming its `stream` and `model`, routed at /ws/<stream>/ (the whole stream as the API
lists it to this person) and /ws/<stream>/<pk>/ (one object the API shows them).

Resumable: every event sent carries its `cursor`, the id of its event row, and a client that
connects with `?after=<cursor>` first gets every event after it that it may see, in order, then
the live ones. The database is the source of truth: a message on the consumer's groups only
wakes it up (and a timer does, in case a publish was lost), and it sends what the event table
holds past the last row it sent, so the switch from replay to live can neither skip nor repeat.

Ids are drawn at insert and rows become visible at commit, so an id can be missing below a
committed one: its transaction still runs (it commits later, out of id order) or it rolled
back. The consumer sends nothing past such an id until it is final, and PostgreSQL says when:
every id at or below the newest one committed when the consumer looked was drawn by a
transaction that had begun by then, so once every transaction of this database that was running
a moment later (an id drawn, its row not yet written, has no xid: hence the moment) has ended,
every one of those ids that will ever commit has committed. That wait has no time limit but the
safety valve GAP_CAP_S. SQLite serialises its writers: an id missing there is final at once.
"""

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass
from importlib import import_module
from urllib.parse import parse_qs

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DatabaseError, InterfaceError, connection
from django.db.models import Q
from django.urls import path
from django.utils import timezone
from redis.exceptions import RedisError

from .actors import Actor
from .choices import TokenScope
from .events import event_fields, subscriptions
from .models import ApiToken

log = logging.getLogger(__name__)

BAD_CURSOR = 4400  # `after` is not an event id, is above the newest, or is past REPLAY_WINDOW
NOT_SIGNED_IN = 4401  # no session, or a bearer token that is unknown, expired or revoked
NOTHING_TO_FOLLOW = 4403  # not found and not yours look the same; a token without `read` too
FOLLOWING_CHANGED = 4409  # memberships or roles changed while open: reconnect to follow anew
AWAY = 1011  # Redis (the channel layer) or the database away: reconnect with the last cursor
# What a store that is away raises: redis-py's errors, a socket's, the database driver's.
AWAY_ERRORS = (RedisError, OSError, DatabaseError, InterfaceError)

BATCH = 500  # rows read at a time (ids when looking for a gap, events when sending them)
# Read even without a wake-up (a publish lost while Redis was away); also how often an open
# socket's sign-in is checked again (its token revoked, its person deactivated, signed out).
POLL_S = 5.0
GAP_RETRY_S = 0.2  # while ids are not final yet
GAP_SLOW_RETRY_S = 1.0  # once they have not been for GAP_SLOW_AFTER_S
GAP_SLOW_AFTER_S = 2.0
# The safety valve: a transaction of this database that stays open this long after the socket
# began to wait for it (one left idle in transaction) no longer holds the socket's events back;
# an event it commits later is not sent on that socket (it stays in the API's history).
GAP_CAP_S = 300.0
# How far back `?after=` may reach, in event ids below the newest one drawn: an older cursor is
# refused (BAD_CURSOR) rather than replayed (a client reads that history over the API).
REPLAY_WINDOW = 100_000
CURSOR = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() takes "١" and "７"
# The subject's fields each event names besides the subject's id, when its model has them.
SUBJECT_FIELDS = ("name", "tenant", "pool", "node", "job")


@dataclass
class Barrier:
    """Ids up to `upto` that are not all final yet: final once the transactions `xids` of this
    database, those running a moment after `since` (None: not read yet), have all ended."""

    upto: int
    since: float
    xids: list[int] | None = None


async def close_away(send, error, *, accepted: bool = False) -> None:
    """Ends a socket with AWAY, after an accept when there was none (a close before the accept
    reaches the browser as a bare 1006, like a server that is down)."""
    log.warning("live events: a store is away (%r); the socket closes with %s", error, AWAY)
    if not accepted:
        await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": AWAY})


def parse_cursor(query_string: bytes) -> int | None:
    """The `after` of a query string: None when absent; ValueError when it is not an id."""
    values = parse_qs(query_string.decode("latin-1")).get("after")
    if not values:
        return None
    if len(values) != 1 or not CURSOR.fullmatch(values[0]):
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
            await close_away(send, error, accepted="websocket.accept" in said)

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
        if after is not None:
            given = await database_sync_to_async(self._last_given)()
            if after > given:
                await self._refuse(BAD_CURSOR, "after: no event has this cursor (yet)")
                return
            if given - after > REPLAY_WINDOW:
                await self._refuse(
                    BAD_CURSOR, "after: older than the replay window; read the events over the API"
                )
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
        self.barrier: Barrier | None = None  # ids past `after` not known final yet
        # without `after`: the ids at or below the first number still missing then, and which
        # of them are to be sent (set by _start_now)
        self.missing_upto, self.missing = 0, frozenset()
        if after is not None:
            self.after = after
        else:  # before the accept: what commits once the client is connected is sent
            await database_sync_to_async(self._start_now)()
        await self.accept()
        self.next_sign_in_check = time.monotonic() + POLL_S
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
        reconnects with its cursor instead of waiting on a socket that no longer sends. A
        sign-in that no longer holds closes it with 4401."""
        try:
            while True:
                self.wake.clear()
                if ended := await self._no_longer_holds():
                    await self.close(code=ended[0], reason=ended[1])
                    return
                events, more = await database_sync_to_async(self._read)()
                for event in events:
                    await self.send_json(event)
                if more == "now":
                    continue
                wait = self._gap_retry_s() if more == "soon" else POLL_S
                wait = min(wait, max(0.0, self.next_sign_in_check - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), wait)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a programming error too: its traceback in the log
            log.warning(
                "live events: reading the events failed (%r); the socket closes with %s",
                error,
                AWAY,
                exc_info=not isinstance(error, AWAY_ERRORS),
            )
            await self.close(code=AWAY)

    def _gap_retry_s(self) -> float:
        waited = time.monotonic() - self.barrier.since if self.barrier else 0.0
        return GAP_SLOW_RETRY_S if waited > GAP_SLOW_AFTER_S else GAP_RETRY_S

    # --- the sign-in, checked again -----------------------------------------------------------

    async def _no_longer_holds(self) -> tuple[int, str] | None:
        """(close code, why) once the socket's sign-in or what it follows no longer holds; read
        again every POLL_S: signed out (4401), or the person's memberships or roles changed, so
        that the groups it joined are no longer what it may follow (4409: reconnect, and follow
        what it may now; 4403 when that is nothing)."""
        if why := await self._signed_out():
            return NOT_SIGNED_IN, why
        if not self.checking_now:
            return None
        now_follows = await database_sync_to_async(self._may_follow_now)()
        if now_follows == self.groups_joined:
            return None
        if not now_follows:
            return NOTHING_TO_FOLLOW, "nothing to follow here any more"
        return FOLLOWING_CHANGED, "what you may follow changed: reconnect"

    def _may_follow_now(self) -> list[str]:
        """The groups the person may follow, their memberships and roles read afresh."""
        user = get_user_model().objects.get(pk=self.actor.user.pk)
        return subscriptions(self.stream, self.model, Actor.for_user(user), self.pk)

    async def _signed_out(self) -> str:
        """Why the socket's sign-in no longer holds ("" while it does): its token expired (at
        once), or, read again every POLL_S, its token was revoked, its person deactivated, or
        its session ended (signed out, the password changed)."""
        self.checking_now = False
        if self.token is not None and self.token.expires_at <= timezone.now():
            return "the token expired"
        if time.monotonic() < self.next_sign_in_check:
            return ""
        self.next_sign_in_check = time.monotonic() + POLL_S
        self.checking_now = True
        if self.token is not None:
            valid = await database_sync_to_async(self._token_still_valid)()
            return "" if valid else "the token was revoked, or its person deactivated"
        session = self.scope.get("session")
        if session is not None and session.session_key:
            # a store of its own: the scope's holds what it read at the handshake
            fresh = import_module(settings.SESSION_ENGINE).SessionStore(session.session_key)
            user = await get_user({**self.scope, "session": fresh})
            same = user.is_authenticated and user.pk == self.actor.user.pk
            return "" if same else "signed out, or the person deactivated"
        active = await database_sync_to_async(self._person_still_active)()
        return "" if active else "the person was deactivated"

    def _token_still_valid(self) -> bool:
        token = ApiToken.objects.filter(pk=self.token.pk, user__is_active=True).first()
        return token is not None and token.is_valid(timezone.now())

    def _person_still_active(self) -> bool:
        return get_user_model().objects.filter(pk=self.actor.user.pk, is_active=True).exists()

    # --- reading the event table ------------------------------------------------------------

    def _newest(self) -> int:
        newest = self.event_model.objects.order_by("-id").values_list("id", flat=True).first()
        return newest or 0

    def _last_given(self) -> int:
        """The highest event id ever drawn (a cursor above it is no cursor), the newest row's
        at least: an event deleted since it was sent (its job's) still left a good cursor."""
        table = self.event_model._meta.db_table
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT coalesce(pg_sequence_last_value("
                    "pg_get_serial_sequence(%s, 'id')::regclass), 0)",
                    [connection.ops.quote_name(table)],
                )
                drawn = cursor.fetchone()[0]
            elif connection.vendor == "sqlite":  # AUTOINCREMENT tables keep theirs here
                cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
                row = cursor.fetchone()
                drawn = row[0] if row else 0
            else:
                drawn = 0
        return max(drawn, self._newest())

    def _start_now(self) -> None:
        """Where a socket without `after` starts: past the newest event committed when it
        connects — and the ids missing below it then, among the BATCH before it, whose
        transactions may still commit them (from the socket's point of view, events that
        happen after it connected): it starts before the first of them and, up to the newest,
        sends only those (in cursor order, with the usual wait until they are final)."""
        if connection.vendor != "postgresql":  # one writer at a time: nothing is in flight
            self.after = self._newest()
            return
        table = connection.ops.quote_name(self.event_model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(  # one statement, one snapshot
                f"WITH newest AS (SELECT coalesce(max(id), 0) AS n FROM {table}) "
                "SELECT n, (SELECT coalesce(array_agg(id), '{}') FROM "
                f"{table} WHERE id > n - %s AND id <= n) FROM newest",
                [BATCH],
            )
            newest, committed = cursor.fetchone()
        missing = set(range(max(newest - BATCH, 0) + 1, newest + 1)).difference(committed)
        self.after = min(missing, default=newest + 1) - 1
        if missing:
            self.missing_upto, self.missing = newest, frozenset(missing)

    def _read(self) -> tuple[list[dict], str]:
        """The events this person may see past `self.after`, up to the last id known final (at
        most BATCH of them), and whether to read again "now" (a full batch), "soon" (ids not
        final yet) or at the next wake-up."""
        final, newest = self._final()
        rows = self.event_model.objects.visible_to(self.actor).filter(
            id__gt=self.after, id__lte=final
        )
        if self.pk is not None:
            rows = rows.filter(**{f"{self.event_model.subject_field}_id": self.pk})
        if self.after < self.missing_upto:  # not those committed before it connected
            rows = rows.filter(Q(id__gt=self.missing_upto) | Q(id__in=self.missing))
        subject = self.event_model.subject_field
        rows = list(rows.select_related(subject).order_by("id")[:BATCH])
        events = [self._payload(row) for row in rows]
        if len(rows) == BATCH:
            self.after = rows[-1].pk
            return events, "now"
        self.after = max(self.after, final)
        return events, "soon" if self.after < newest else "later"

    def _final(self) -> tuple[int, int]:
        """(final, newest): every id up to `final` that will ever commit has committed (never
        below `self.after`); `newest` is the newest id committed now. Ids past `self.after`
        that all committed, one after the other, are final at once; beyond the first one
        missing, they become final when the barrier set on them falls (see the module's
        docstring)."""
        barrier = self.barrier
        waits_for = barrier.xids if barrier is not None and barrier.xids else []
        newest, ids, running = self._look(waits_for)
        final = self.after
        for event_id in ids:
            if event_id != final + 1:
                break
            final = event_id
        if connection.vendor != "postgresql":  # one writer at a time: nothing is still running
            return max(final, newest), newest
        if barrier is not None and barrier.upto <= final:
            barrier = None
        if barrier is not None:
            now = time.monotonic()
            if barrier.xids is None and now - barrier.since >= GAP_RETRY_S:
                barrier.xids = running = self._running_xids()
            if barrier.xids is not None and not running:
                final, barrier = max(final, barrier.upto), None
            elif now - barrier.since > GAP_CAP_S:
                log.warning(
                    "live events: %s ids up to %s not final after %.0f s (transactions %s of "
                    "this database still open): the socket waits no longer",
                    self.stream,
                    barrier.upto,
                    GAP_CAP_S,
                    running,
                )
                final, barrier = max(final, barrier.upto), None
        if barrier is None and final < newest:
            barrier = Barrier(upto=newest, since=time.monotonic())
        self.barrier = barrier
        return final, newest

    def _look(self, waits_for: list[int]) -> tuple[int, list[int], list[int]]:
        """One statement, so one snapshot: the newest committed id (anyone's), the committed
        ids of the BATCH past `self.after` (ids only), and which of the transactions
        `waits_for` still run."""
        rows = self.event_model.objects
        if connection.vendor != "postgresql":
            ids = rows.filter(id__gt=self.after, id__lte=self.after + BATCH).order_by("id")
            return self._newest(), list(ids.values_list("id", flat=True)), []
        table = connection.ops.quote_name(self.event_model._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (SELECT coalesce(max(id), 0) FROM {table}), "
                "(SELECT coalesce(array_agg(id ORDER BY id), '{}') "
                f"FROM {table} WHERE id > %s AND id <= %s), "
                "(SELECT coalesce(array_agg(x::text::bigint), '{}') "
                "FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
                "WHERE x::text::bigint = ANY(%s::bigint[]))",
                [self.after, self.after + BATCH, waits_for],
            )
            return cursor.fetchone()

    @staticmethod
    def _running_xids() -> list[int]:
        """The transactions running now (their xids) but those known to be of another database
        of the server: ours may hold an id still missing; another's cannot. An xid whose
        holder is not found (it has just begun, a prepared transaction) counts as ours."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(array_agg(x::text::bigint), '{}') "
                "FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
                "WHERE xid(x) NOT IN (SELECT l.transactionid FROM pg_locks AS l "
                "JOIN pg_stat_activity AS a ON a.pid = l.pid "
                "WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted "
                "AND a.datname IS DISTINCT FROM current_database())"
            )
            return cursor.fetchone()[0]

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
