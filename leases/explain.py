"""The refusals of a reserve and how an explanation of the core reads in them. Pure: no ORM.

Every explanation anyone is shown (409/422 bodies, a job's `pending_reason`, explain, the
console) passes `explanation_dict`: where another tenant's lease must end before the request
fits, it tells a coarse window (`fits_within`: "within the hour", "in 1–4 hours" …), never the
time (`fits_at` is null); only a wait on the requester's own leases is told exactly."""

from __future__ import annotations

from django.utils import timezone

from placement import types as core
from placement.explain import FREES_UP, coarse_window
from pools.statemachine import Refusal


class NoCapacity(Refusal):
    """Nothing fits now (409): reason codes with node counts and the nearest miss."""

    status = 409
    code = "no_capacity"

    def __init__(self, explanation: dict):
        super().__init__(explanation.get("message", "no capacity"))
        # what a queued job keeps as its pending_reason; the API body adds `detail`
        self.explanation = {"code": self.code, **explanation}
        self.extra = self.explanation


class NeverFits(NoCapacity):
    """The shape cannot fit in the pool even on an empty node (422)."""

    status = 422
    code = "never_fits"


class IdempotencyKeyReused(Refusal):
    """The key names an earlier reserve of the tenant that asked for something else (422)."""

    status = 422
    code = "idempotency_key_reused"


def _window(near: core.NearMiss | None, now) -> str | None:
    """The coarse window in which capacity frees up for the request, or None (no wait known)."""
    if near is None or not hasattr(near.fits_at, "tzinfo"):
        return None
    return coarse_window((near.fits_at - now).total_seconds())


def _coarse(text: str, window: str | None, near: core.NearMiss | None) -> str:
    """The core's words for a wait on another tenant's lease, with the window added."""
    if window is None or near is None or near.fits_exact:
        return text
    return text.replace(FREES_UP, f"{FREES_UP} {window}")


def nearest_miss_dict(near: core.NearMiss | None, now=None) -> dict | None:
    if near is None:
        return None
    window = _window(near, now or timezone.now())
    exact = near.fits_at is not None and near.fits_exact
    return {
        "node": near.node,
        "reason": near.reason,
        "lacking": dict(near.lacking),
        "message": _coarse(near.message, window, near),
        # when capacity frees up: exactly only when the leases that must end are all the
        # requester's own; always as a coarse window; where it would then fit
        "fits_at": near.fits_at.isoformat() if exact and window else None,
        "fits_within": window,
        "fits_on": near.fits_on or None,
        "after_leases": list(near.after_leases),
    }


def explanation_dict(explanation: core.Explanation, *, now=None, **extra) -> dict:
    near = explanation.nearest_miss
    now = now or timezone.now()
    return {
        "message": _coarse(explanation.message, _window(near, now), near),
        "total_nodes": explanation.total_nodes,
        "reasons": dict(explanation.reasons),
        "nearest_miss": nearest_miss_dict(near, now),
        "policy_version": explanation.policy_version,
        **extra,
    }
