"""What a reserve asks to hold — a duration or a reservation `Window` — and the digest of a
keyed reserve's request (a retry with the same key must ask the same). Pure: no ORM."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson


def as_timedelta(value) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=float(value))


@dataclass(frozen=True)
class Window:
    """A reservation window: capacity is held for [start, end) and must be claimed by
    start + tolerance."""

    start: datetime
    end: datetime
    tolerance: timedelta = timedelta(minutes=5)

    @classmethod
    def coerce(cls, value) -> Window | None:
        if value is None or isinstance(value, Window):
            return value
        if isinstance(value, dict):
            tolerance = value.get("tolerance", value.get("tolerance_s", 300))
            return cls(value["start"], value["end"], as_timedelta(tolerance))
        start, end, *rest = value
        return cls(start, end, as_timedelta(rest[0]) if rest else timedelta(minutes=5))


def request_digest(pool, request: dict, hold) -> str:
    """What a keyed reserve asked for: the pool, the resources, and its window or duration
    (`hold`). Stored with the lease; a retry with the same key must ask the same."""
    if isinstance(hold, Window):
        hold = [hold.start.timestamp(), hold.end.timestamp(), hold.tolerance.total_seconds()]
    else:
        hold = hold.total_seconds()
    body = orjson.dumps([pool.pk, request, hold], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()
