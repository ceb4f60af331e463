"""The `now` of a periodic task, as every app's task module takes it."""

from datetime import datetime

from django.utils import timezone


def parse_now(now):
    """A task's `now`: None (the time it runs), a datetime, or an ISO string (over the broker)."""
    if now is None:
        return timezone.now()
    return datetime.fromisoformat(now) if isinstance(now, str) else now
