"""One pass per pool at a time, and passes on events coalesced (docs/scheduler.md, "When a pass
runs" and "One pass per pool at a time").

* **The lock.** A pool's pass runs under the pool's lock: on PostgreSQL a session-level advisory
  lock (`pg_try_advisory_lock(LOCK_SPACE, pool id)`, released when the pass is done; a worker
  that dies takes it with its connection), elsewhere (SQLite under `make run`) a Redis key set
  with NX and an expiry of the pass's hard time limit. Nobody waits for it.
* **Wanted.** Whoever wants a pass of a pool sets the pool's `wanted` flag, then tries the lock.
  The holder clears the flag before each pass and, after it, looks again: set meanwhile, it runs
  one more pass (however many asked), so no request is lost and requests never queue passes up.
  A request that finds the lock taken has nothing more to do. After releasing the lock the
  holder looks once more, and takes the lock again if the flag was set in between.
* **Paced.** A pass started by an event begins at least `SCHEDULER_EVENT_MIN_INTERVAL_S` after
  the pool's previous pass ended (`ended`, in Redis), and an event pass on its way (`queued`)
  swallows the requests that come before it starts: a burst makes a pass at most every
  interval, and its last request is served by the pass after the interval (the trailing edge).

The state lives in Redis (`REDIS_URL`) under a prefix of the database's identity, so two
deployments, or two test databases, on one Redis never share a pool's keys. Where Redis fails,
the lock's holder still runs its one pass (and on SQLite runs it unlocked, as before the lock).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager

import redis
from django.conf import settings
from django.db import DatabaseError, connection

logger = logging.getLogger(__name__)

# The first key of the two-key advisory lock: what is locked (a pool's pass), the second the
# pool's id. 'PASS' in ASCII; pg_locks shows it as classid.
LOCK_SPACE = 0x50415353
# The Redis lock outlives a holder that died at most this long: the pass task's hard time
# limit (scheduling/tasks.py PASS_TIME_LIMIT_S, the same 30 periods), past which the worker has
# killed the process that held it.
LOCK_TTL_S = 30 * settings.SCHEDULER_PASS_PERIOD_S
# An event pass on its way swallows the requests before it starts; should its task be lost (a
# broker restart), requests start sending again after its delay and this long (beat's pass,
# every period, places meanwhile).
QUEUED_TTL_S = 5.0
# A holder that keeps finding passes wanted hands the pool over to a fresh task after this
# long (a continuous stream of submits would otherwise keep one task past its time limit).
EVENT_BUDGET_S = 5 * settings.SCHEDULER_PASS_PERIOD_S

_UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"
_clients: dict[str, redis.Redis] = {}


def redis_client() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:  # thread-safe; redis-py starts a fresh pool after a fork
        _clients[url] = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    return _clients[url]


def on_postgresql() -> bool:
    """Whether the pool's lock is PostgreSQL's advisory lock (else Redis's)."""
    return connection.vendor == "postgresql"


def key_prefix() -> str:
    """The database this process writes to, read when asked (a test database's name is set
    once the test run created it)."""
    db = connection.settings_dict
    where = "|".join(str(db.get(key) or "") for key in ("ENGINE", "HOST", "PORT", "NAME"))
    return "computepool:pass:" + hashlib.sha256(where.encode()).hexdigest()[:12]


class PoolPasses:
    """The Redis state of one pool's passes: `wanted`, `queued`, `ended` (seconds since the
    epoch) and, off PostgreSQL, `lock`. A Redis error is logged once; the answers then are the
    ones that keep the caller's own pass (`take_wanted(default=True)`) and nothing more."""

    def __init__(self, pool_id: int):
        self.pool_id = pool_id
        prefix = f"{key_prefix()}:{pool_id}"
        self.wanted_key, self.queued_key = f"{prefix}:wanted", f"{prefix}:queued"
        self.ended_key, self.lock_key = f"{prefix}:ended", f"{prefix}:lock"
        self.failed = False

    def _redis(self, op, default):
        if self.failed:
            return default
        try:
            return op(redis_client())
        except redis.RedisError:
            logger.warning(
                "pool %s: Redis failed, passes not coordinated", self.pool_id, exc_info=1
            )
            self.failed = True
            return default

    def want(self) -> None:
        self._redis(lambda r: r.set(self.wanted_key, 1, px=int(LOCK_TTL_S * 1000)), None)

    def take_wanted(self, default: bool) -> bool:
        return self._redis(lambda r: r.delete(self.wanted_key), int(default)) == 1

    def is_wanted(self) -> bool:
        return bool(self._redis(lambda r: r.exists(self.wanted_key), 0))

    def mark_ended(self) -> None:
        self._redis(lambda r: r.set(self.ended_key, repr(time.time()), px=60_000), None)

    def delay(self, interval_s: float) -> float:
        """Seconds until the pool's next paced pass may start."""
        ended = self._redis(lambda r: r.get(self.ended_key), None)
        return max(0.0, float(ended) + interval_s - time.time()) if ended else 0.0

    def queue(self, delay_s: float) -> bool:
        """True when no event pass is on its way (this caller sends one)."""
        ttl_ms = int((delay_s + QUEUED_TTL_S) * 1000)
        return bool(self._redis(lambda r: r.set(self.queued_key, 1, nx=True, px=ttl_ms), True))

    def unqueue(self) -> None:
        self._redis(lambda r: r.delete(self.queued_key), None)

    @contextmanager
    def lock(self):
        """Yields whether this process now holds the pool's lock; never waits."""
        if on_postgresql():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_SPACE, self.pool_id])
                held = cursor.fetchone()[0]
            try:
                yield held
            finally:
                if held:
                    self._pg_unlock()
            return
        token = uuid.uuid4().hex
        ttl_ms = int(LOCK_TTL_S * 1000)
        held = self._redis(lambda r: r.set(self.lock_key, token, nx=True, px=ttl_ms), True)
        try:
            yield bool(held)
        finally:
            if held:
                self._redis(lambda r: r.eval(_UNLOCK, 1, self.lock_key, token), None)

    def _pg_unlock(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_SPACE, self.pool_id])
        except DatabaseError:  # the connection is gone, and the session's lock with it
            logger.exception("pool %s: could not release the pass lock", self.pool_id)


def run_exclusive(
    pool_id: int,
    one_pass: Callable[[int], None],
    *,
    pace_s: float = 0.0,
    pace_first: bool = False,
    budget_s: float = 0.0,
    hand_over: Callable[[int], None] | None = None,
) -> int:
    """Asks for a pass of the pool and, holding its lock, runs `one_pass(n)` (n: the passes this
    call ran before) while one is wanted; returns how many it ran (0: another holder runs it).

    `pace_s`: each pass starts that long after the pool's previous one ended (the first too with
    `pace_first`). After its first pass a holder runs one more whenever asked meanwhile, and
    further ones while `budget_s` has not passed since it began; beyond, it leaves the request
    standing and calls `hand_over(pool_id)` (a fresh task), if given."""
    state = PoolPasses(pool_id)
    state.want()
    began, runs = time.monotonic(), 0

    def may_run() -> bool:
        return runs < 2 or time.monotonic() - began < budget_s

    while True:
        with state.lock() as held:
            if not held:
                return runs
            while may_run() and state.take_wanted(default=runs == 0):
                if pace_s and (runs or pace_first):
                    time.sleep(state.delay(pace_s))
                try:
                    one_pass(runs)
                finally:
                    state.mark_ended()
                runs += 1
        if not state.is_wanted():
            return runs
        if not may_run():
            if hand_over is not None:
                hand_over(pool_id)
            return runs
