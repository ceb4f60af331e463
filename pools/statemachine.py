"""The one way a stateful row changes state: lock, check the map, save, write the event.

Each app declares its allowed-transitions map in choices.py and calls `transition(...)` from
its services; nothing else assigns a `state` field.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from .actors import Actor
from .reasons import REASON_CODES, Reason

logger = logging.getLogger(__name__)


class Refusal(Exception):
    """A request the domain refuses for a reason it can name. The API answers every one alike
    (pools/api/errors.py): `status`, and the body `{"code", "detail", **extra}`."""

    status = 409
    code = "refused"

    def __init__(self, message: str, *, code: str = "", extra: dict | None = None):
        super().__init__(message)
        self.code = code or self.code
        self.message = message
        self.extra = extra or {}

    def body(self) -> dict:
        return {"code": self.code, "detail": self.message, **self.extra}


class TransitionRefused(Refusal):
    """A transition the allowed-transitions map forbids, or a precondition that failed (409)."""

    def __init__(self, code: str, message: str):
        super().__init__(message, code=code)


class EventBase(models.Model):
    """Timestamped record of one transition: who, when, from, to, why (reason code), message."""

    subject_field: str = ""  # the FK name to the stateful row, set by subclasses

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor_kind = models.CharField(max_length=8)
    actor_label = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20)
    # Not `choices=`: a new code would need a migration of every event table; `build` checks it.
    reason = models.CharField(max_length=40, db_index=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        abstract = True
        ordering = ["at", "id"]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.from_state or '∅'}→{self.to_state} {self.reason}"

    @classmethod
    def build(
        cls,
        subject,
        *,
        actor: Actor,
        from_state: str,
        to_state: str,
        reason: str,
        message: str = "",
        at=None,
        data: dict | None = None,
    ):
        if reason not in REASON_CODES:
            raise ValueError(f"unknown reason code {reason!r}")
        return cls(
            **{cls.subject_field: subject},
            at=at or timezone.now(),
            actor_kind=actor.kind,
            actor_label=actor.label,
            actor_user_id=actor.user_id,
            from_state=from_state,
            to_state=to_state,
            reason=reason,
            message=message,
            data=data or {},
        )

    @classmethod
    def record(cls, subject, **kwargs):
        event = cls.build(subject, **kwargs)
        event.save()
        return event


def check_allowed(model, obj, from_state: str, to: str, allowed: Mapping[str, frozenset[str]]):
    """The allowed-transitions map's word on `obj` (a row of `model`, or its id) going from
    `from_state` to `to`: TransitionRefused("transition_not_allowed") when it forbids it."""
    if to not in allowed.get(from_state, frozenset()):
        raise TransitionRefused(
            "transition_not_allowed",
            f"{model._meta.verbose_name} {obj} cannot go from {from_state} to {to}",
        )


def transition(
    model: type[models.Model],
    pk: Any,
    *,
    to: str,
    allowed: Mapping[str, frozenset[str]],
    event_model: type[EventBase],
    actor: Actor,
    reason: str,
    message: str = "",
    now=None,
    changes: Mapping[str, Any] | None = None,
    check: Callable[[Any], None] | None = None,
    data: dict | None = None,
    on_commit: Callable[[Any, EventBase], None] | None = None,
):
    """Move row `pk` of `model` to state `to`, or raise TransitionRefused having changed nothing.

    `changes` are extra fields saved with the state; `check(obj)` may raise TransitionRefused
    after the row is locked (e.g. a fencing-token mismatch); `on_commit(obj, event)` runs only
    once the transaction has committed (Channels, Celery).
    """
    now = now or timezone.now()
    with transaction.atomic():
        obj = model.objects.select_for_update().get(pk=pk)
        from_state = obj.state
        check_allowed(model, obj, from_state, to, allowed)
        if check is not None:
            check(obj)
        obj.state = to
        obj.state_changed_at = now
        fields = ["state", "state_changed_at"]
        for field, value in (changes or {}).items():
            setattr(obj, field, value)
            fields.append(field)
        obj.save(update_fields=fields)
        event = event_model.record(
            obj,
            actor=actor,
            from_state=from_state,
            to_state=to,
            reason=reason,
            message=message,
            at=now,
            data=data,
        )
        if on_commit is not None:
            transaction.on_commit(lambda: on_commit(obj, event))
    return obj


def create_many(
    objs: Sequence[models.Model],
    *,
    path: Sequence[tuple[str, str, str]],
    allowed: Mapping[str, frozenset[str]],
    event_model: type[EventBase],
    actor: Actor,
    now,
) -> list:
    """New rows written at once as their services create and move each one: `path` is the
    steps (to state, reason, message) each row takes, the first one its creation, every later
    one checked against the map. The rows are saved in the last state, each with one event per
    step, in bulk INSERTs and without live events (for fleets and queues of thousands: the
    scheduler benchmark builds with it)."""
    objs = list(objs)
    states = [to for to, _, _ in path]
    if not objs:
        return objs
    model = type(objs[0])
    for from_state, to in itertools.pairwise(states):
        check_allowed(model, f"({len(objs)} new)", from_state, to, allowed)
    for obj in objs:
        obj.state, obj.state_changed_at = states[-1], now
    steps = list(zip(["", *states], path, strict=False))
    with transaction.atomic():
        model.objects.bulk_create(objs, batch_size=2000)
        event_model.objects.bulk_create(
            (
                event_model.build(
                    obj,
                    actor=actor,
                    from_state=from_state,
                    to_state=to,
                    reason=reason,
                    message=message,
                    at=now,
                )
                for obj in objs
                for from_state, (to, reason, message) in steps
            ),
            batch_size=5000,
        )
    return objs


# --- failures of periodic work: recorded on the row, never stopping the others ------------


def error_summary(error: Exception) -> str:
    """`Type: first line`, at most 500 characters. Only the first line: PostgreSQL's "DETAIL:
    Failing row contains (…)" carries row values (timestamps among them), which would copy data
    into events and make every repeat of one failure look new."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line}"[:500]


def record_sweep_failure(model, pk, *, event_model, actor: Actor, error: Exception, now) -> None:
    """One bad row never stops a sweep: called from its `except`, after the row's transaction
    rolled back. Logs the error and records it on the row as a `sweep_failed` event (state
    unchanged), once per distinct error: a row failing every minute must not flood its
    history. A failure to record is logged too, and the sweep still goes on."""
    logger.exception("%s %s: sweep by %s failed", model._meta.label, pk, actor.label)
    message = error_summary(error)
    try:
        with transaction.atomic():
            obj = model.objects.filter(pk=pk).first()
            if obj is None:
                return
            events = event_model.objects.filter(**{event_model.subject_field: obj})
            if events.order_by("-at", "-id").values_list("reason", "message").first() == (
                Reason.SWEEP_FAILED,
                message,
            ):
                return
            event_model.record(
                obj,
                actor=actor,
                from_state=obj.state,
                to_state=obj.state,
                reason=Reason.SWEEP_FAILED,
                message=message,
                at=now,
            )
    except Exception:
        logger.exception("%s %s: could not record the sweep failure", model._meta.label, pk)
