"""The refusals of a reserve and how an explanation of the core reads in them. Pure: no ORM."""

from __future__ import annotations

from pools.statemachine import Refusal
from scheduling.core import types as core


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


def nearest_miss_dict(near: core.NearMiss | None) -> dict | None:
    if near is None:
        return None
    return {
        "node": near.node,
        "reason": near.reason,
        "lacking": dict(near.lacking),
        "message": near.message,
        # when capacity frees up: the leases that must end first, and where it would then fit
        "fits_at": near.fits_at.isoformat() if near.fits_at else None,
        "fits_on": near.fits_on or None,
        "after_leases": list(near.after_leases),
    }


def explanation_dict(explanation: core.Explanation, **extra) -> dict:
    return {
        "message": explanation.message,
        "total_nodes": explanation.total_nodes,
        "reasons": dict(explanation.reasons),
        "nearest_miss": nearest_miss_dict(explanation.nearest_miss),
        "policy_version": explanation.policy_version,
        **extra,
    }
