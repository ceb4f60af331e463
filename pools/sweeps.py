"""The one loop of periodic per-row work (the beat's sweeps): every sweep hands its due rows and
its step to `sweep`, which owns the batch cap, the SKIP LOCKED rule and what a failure does.
Safe on several workers at once: they split the rows between them and never wait on each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from .actors import Actor
from .statemachine import EventBase, TransitionRefused, record_sweep_failure

# Rows one sweep handles at most (the lowest ids first): a backlog is worked off over the next
# runs, and a sweep stays short enough to end before the next one of its schedule is due.
SWEEP_BATCH = 500


def sweep(
    due: QuerySet,
    step: Callable[[Any], Any],
    *,
    event_model: type[EventBase],
    actor: Actor,
    now,
    batch: int = SWEEP_BATCH,
) -> dict[Any, Any]:
    """{id: step(row)} for each row of `due` it handled, at most `batch` of them.

    Each row in its own transaction, locked first (`FOR UPDATE SKIP LOCKED` of the row alone)
    and only while it still matches `due`: a row another worker holds right now, or that no
    longer matches (handled meanwhile), is skipped and left out. `step(row)` runs under that
    lock. A step refused by the state machine (`TransitionRefused`: someone moved the row
    first) counts as not done. Any other error rolls the row back and is recorded on it
    (`record_sweep_failure`: `sweep_failed`, once per distinct error); the sweep goes on."""
    done = {}
    for pk in list(due.order_by("pk").values_list("pk", flat=True)[:batch]):
        try:
            with transaction.atomic():
                row = due.select_for_update(skip_locked=True, of=("self",)).filter(pk=pk).first()
                if row is None:
                    continue
                done[pk] = step(row)
        except TransitionRefused:
            continue
        except Exception as error:
            record_sweep_failure(
                due.model, pk, event_model=event_model, actor=actor, error=error, now=now
            )
    return done
