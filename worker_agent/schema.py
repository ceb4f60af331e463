"""The inventory format, defined once: `schemas/inventory-v1.json` (JSON Schema 2020-12).

The agent checks what it is about to send against it, and the control plane checks what it
receives against the same file (`nodes.api.serializers.InventorySerializer`), so the two sides
cannot disagree. `inventory_errors` is that check: the schema, then the two rules a schema
cannot say (unique GPU UUIDs and indexes), as (path, message) pairs a person can read.
"""

from __future__ import annotations

import json
from importlib import resources
from itertools import islice

from jsonschema import Draft202012Validator, validators

SCHEMA_VERSION = 1
INVENTORY_SCHEMA: dict = json.loads(
    resources.files(__package__).joinpath(f"schemas/inventory-v{SCHEMA_VERSION}.json").read_text()
)
GPU_SCHEMA: dict = INVENTORY_SCHEMA["properties"]["gpus"]["items"]
GPU_KEYS = tuple(GPU_SCHEMA["properties"])  # what one device's inventory may hold

# An integer is a JSON integer: jsonschema would also take 3.0, and never a bool.
_Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)
_VALIDATOR = _Validator(INVENTORY_SCHEMA)

_TYPES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}
# Messages name the bound, never echo the value (which may be a 300-item list).
_MESSAGES = {
    "minimum": "Ensure this value is greater than or equal to {}.",
    "maximum": "Ensure this value is less than or equal to {}.",
    "minLength": "Ensure this field has at least {} characters.",
    "maxLength": "Ensure this field has no more than {} characters.",
    "maxItems": "Ensure this field has no more than {} elements.",
    "const": "Must be {}.",
}

Path = tuple[str | int, ...]


class InventoryInvalid(ValueError):
    """An inventory the schema refuses; `errors` holds (path, message) pairs."""

    def __init__(self, errors: list[tuple[Path, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, p)) or '(root)'}: {m}" for p, m in errors))


def inventory_errors(inventory) -> list[tuple[Path, str]]:
    """Everything wrong with `inventory`, each as (path to the field, message); [] if valid."""
    explained = (pair for error in _VALIDATOR.iter_errors(inventory) for pair in _explain(error))
    errors = list(dict.fromkeys(explained))  # each missing field is reported once per field
    if errors:
        return errors
    gpus = inventory.get("gpus", [])
    uuids = [gpu["uuid"] for gpu in gpus]
    if len(set(uuids)) != len(uuids):
        errors.append((("gpus",), "GPU UUIDs must be unique."))
    indexes = [gpu.get("index", i) for i, gpu in enumerate(gpus)]  # a GPU's default: its position
    if len(set(indexes)) != len(indexes):
        errors.append((("gpus",), "GPU indexes must be unique."))
    return errors


def validate_inventory(inventory) -> dict:
    """`inventory` itself if the schema takes it; raises InventoryInvalid otherwise."""
    errors = inventory_errors(inventory)
    if errors:
        raise InventoryInvalid(errors)
    return inventory


def _explain(error) -> list[tuple[Path, str]]:
    path, keyword, bound = tuple(error.absolute_path), error.validator, error.validator_value
    if keyword == "required":  # reported on the object: name the missing field itself
        return [
            ((*path, name), "This field is required.")
            for name in bound
            if name not in error.instance
        ]
    if keyword == "additionalProperties":
        known = error.schema.get("properties", {})
        return [((*path, name), "Unknown field.") for name in error.instance if name not in known]
    if keyword == "type":
        kinds = [bound] if isinstance(bound, str) else bound
        return [(path, f"Must be {' or '.join(_TYPES[kind] for kind in kinds)}.")]
    if keyword == "enum":
        return [(path, f"Must be one of: {', '.join(map(str, bound))}.")]
    if keyword in _MESSAGES:
        return [(path, _MESSAGES[keyword].format(bound))]
    return [(path, error.schema.get("description") or "Invalid value.")]  # anyOf and the like


# The storage parts of a heartbeat (disk, caches, downloads): `schemas/storage-v1.json`, checked
# by the agent before it sends and by the control plane when it receives
# (nodes.api.serializers.HeartbeatSerializer), as the inventory is.
STORAGE_SCHEMA: dict = json.loads(
    resources.files(__package__).joinpath("schemas/storage-v1.json").read_text()
)
STORAGE_PARTS = tuple(STORAGE_SCHEMA["properties"])  # ("disk", "cache", "downloads")
STORAGE_ERRORS_MAX = 20  # a hostile report is told its first few problems, not thousands


def _storage_overlong(report) -> list[tuple[Path, str]]:
    """The lists longer than the schema allows, found without walking their items."""
    if not isinstance(report, dict):
        return []
    props = STORAGE_SCHEMA["properties"]
    lists = [(("downloads",), report.get("downloads"), props["downloads"]["maxItems"])]
    cache = report.get("cache")
    if isinstance(cache, dict):
        for part in ("images", "inputs"):
            bound = props["cache"]["properties"][part]["maxItems"]
            lists.append((("cache", part), cache.get(part), bound))
    return [
        (path, _MESSAGES["maxItems"].format(bound))
        for path, value, bound in lists
        if isinstance(value, list) and len(value) > bound
    ]


_STORAGE_VALIDATOR = _Validator(STORAGE_SCHEMA)


def storage_errors(report) -> list[tuple[Path, str]]:
    """Everything wrong with a heartbeat's storage parts ({"disk": …, "cache": …,
    "downloads": …}, each optional), as (path, message) pairs; [] if valid. Beyond the schema:
    free and held within the disk's size, each digest and key listed once."""
    if too_long := _storage_overlong(report):
        return too_long  # before the schema walks a hostile list item by item
    explained = (pair for e in _STORAGE_VALIDATOR.iter_errors(report) for pair in _explain(e))
    errors = list(dict.fromkeys(islice(explained, STORAGE_ERRORS_MAX)))
    if errors:
        return errors
    disk = report.get("disk")
    if disk is not None:
        for field in ("free_bytes", "held_bytes"):
            if disk[field] > disk["total_bytes"]:
                errors.append((("disk", field), "Must not exceed total_bytes."))
    cache = report.get("cache") or {}
    for part, key in (("images", "digest"), ("inputs", "key")):
        names = [entry[key] for entry in cache.get(part, ())]
        if len(set(names)) != len(names):
            errors.append((("cache", part), f"Each {key} is listed once."))
    return errors


# One GPU's health readings in a heartbeat: `schemas/gpu-health-v1.json`. The agent leaves out
# what it refuses; the control plane holds the same bounds (nodes.api.serializers
# GpuReadingSerializer, a 400 otherwise).
GPU_HEALTH_SCHEMA: dict = json.loads(
    resources.files(__package__).joinpath("schemas/gpu-health-v1.json").read_text()
)
THROTTLE_REASON_NAMES = tuple(GPU_HEALTH_SCHEMA["properties"]["throttle_reasons"]["items"]["enum"])
_GPU_HEALTH_VALIDATOR = _Validator(GPU_HEALTH_SCHEMA)


def gpu_health_errors(reading) -> list[tuple[Path, str]]:
    """Everything wrong with one device's health reading, as (path, message) pairs."""
    explained = (pair for e in _GPU_HEALTH_VALIDATOR.iter_errors(reading) for pair in _explain(e))
    return list(dict.fromkeys(islice(explained, STORAGE_ERRORS_MAX)))


def checked_gpu_health(reading: dict) -> dict | None:
    """The reading without the fields the schema refuses, so that one odd reading never makes
    the control plane refuse the whole heartbeat; None when what is left is still refused."""
    errors = gpu_health_errors(reading)
    if not errors:
        return reading
    bad = {path[0] for path, _ in errors if path}
    known = GPU_HEALTH_SCHEMA["properties"]
    kept = {k: v for k, v in reading.items() if k in known and k not in bad}
    return kept if not gpu_health_errors(kept) else None
