"""Type and range rules for values people send: resource shapes, job bodies, policy versions.

One place for each rule: ResourceShape.clean() (the admin, and the API's resource requests, which
run the shape's clean) and the API serializers use these, so the scheduler only ever sees values
it can handle. Raise Django's ValidationError; DRF turns it into 400 field errors.
"""

import re

from django.core.exceptions import ValidationError

from pools.choices import DrainPolicy
from scheduling.core import policy_problems

# Lists of names in a shape (gpu_models, regions, zones).
LIST_MAX_ITEMS = 32
LIST_ITEM_MAX_CHARS = 64
GPU_COUNT_MAX = 64

# A job's command and environment.
COMMAND_MAX_ITEMS = 256
COMMAND_ITEM_MAX_CHARS = 4096
ENV_MAX_ENTRIES = 128
ENV_KEY_MAX_CHARS = 128
ENV_VALUE_MAX_CHARS = 4096
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

# Policy versions: the knobs the code reads (the reservation defaults of the lease services
# and nodes' pool_drain_policy). Scorer weights are the core's to check (its registry).
RESERVATION_KNOB_MAX_S = 365 * 86400

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable(value: str) -> None:
    """A name never holds control characters (NUL, newlines, escapes)."""
    if _CONTROL.search(value):
        raise ValidationError("Control characters are not allowed.")


def string_list(value) -> None:
    """A list of at most LIST_MAX_ITEMS non-empty printable strings of LIST_ITEM_MAX_CHARS."""
    if not isinstance(value, list):
        raise ValidationError("A list of strings.")
    if len(value) > LIST_MAX_ITEMS:
        raise ValidationError(f"At most {LIST_MAX_ITEMS} items.")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > LIST_ITEM_MAX_CHARS:
            raise ValidationError(
                f"Each item is a string of 1 to {LIST_ITEM_MAX_CHARS} characters."
            )
        printable(item)


def shape_errors(shape) -> dict[str, list[str]]:
    """What the columns alone do not refuse: list fields and the GPU count's ceiling."""
    errors = {}
    for field in ("gpu_models", "regions", "zones"):
        try:
            string_list(getattr(shape, field))
        except ValidationError as exc:
            errors[field] = exc.messages
    if isinstance(shape.gpu_count, int) and shape.gpu_count > GPU_COUNT_MAX:
        errors["gpu_count"] = [f"At most {GPU_COUNT_MAX} GPUs."]
    return errors


def env_mapping(value: dict) -> None:
    """Environment variables: a bounded number of POSIX-style names (values bounded by the
    serializer's field)."""
    if len(value) > ENV_MAX_ENTRIES:
        raise ValidationError(f"At most {ENV_MAX_ENTRIES} variables.")
    for key in value:
        if len(key) > ENV_KEY_MAX_CHARS or not ENV_KEY.fullmatch(key):
            raise ValidationError(
                f"{key[:ENV_KEY_MAX_CHARS]!r}: names match [A-Za-z_][A-Za-z0-9_]* and have at"
                f" most {ENV_KEY_MAX_CHARS} characters."
            )


def _reservation_seconds(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of seconds"
    if not 1 <= value <= RESERVATION_KNOB_MAX_S:
        return f"between 1 and {RESERVATION_KNOB_MAX_S} s"
    return None


def _drain_policy(value) -> str | None:
    return None if value in DrainPolicy.values else f"one of {', '.join(DrainPolicy.values)}"


# knob name → check returning what the value must be, or None when it is valid.
KNOBS = {
    "reservation_max_horizon_s": _reservation_seconds,
    "reservation_max_hold_s": _reservation_seconds,
    "reservation_max_tolerance_s": _reservation_seconds,
    "drain_noncheckpointable": _drain_policy,
}


def policy_version(weights, knobs) -> None:
    """A policy version's weights and knobs, checked at publish time (API, admin, service):
    weights name the core's registered scorers with non-negative numbers."""
    errors = policy_problems(weights)
    if not isinstance(knobs, dict):
        errors["knobs"] = ["A map of knob name to its value."]
    elif problems := _problems(knobs, KNOBS):
        errors["knobs"] = problems
    if errors:
        raise ValidationError(errors)


def _problems(values: dict, checks: dict) -> list[str]:
    problems = []
    for name, value in values.items():
        check = checks.get(name)
        if check is None:
            problems.append(f"{name!r} is unknown (known: {', '.join(sorted(checks))}).")
        elif problem := check(value):
            problems.append(f"{name!r} must be {problem}.")
    return problems
