"""A job manifest: the body of `POST /api/v1/jobs` (same field names) as a YAML or JSON file,
and the flags of `poolctl submit` that set or override its fields."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from poolctl.config import UsageError


def read(path: str) -> dict:
    """The manifest at `path` ("-": standard input). JSON when it ends in .json, YAML
    otherwise (YAML reads JSON too)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{path} is not valid {_kind(path)}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a manifest is a mapping of job fields, e.g. name: train")
    return data


def _kind(path: str) -> str:
    return "JSON" if path.endswith(".json") else "YAML"


def pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    """KEY=VALUE flags (`--env A=1 --env B=2`) as a mapping."""
    result = {}
    for value in values or []:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, not {value!r}")
        result[key] = item
    return result


RESOURCE_FLAGS = {  # flag attribute → inline resource field
    "cpu": "cpu_millicores_min",
    "memory": "memory_mib_min",
    "scratch": "scratch_mib",
    "gpus": "gpu_count",
    "gpu_sharing": "gpu_sharing_class",
    "gpu_milli": "gpu_milli",
    "mig_profile": "mig_profile",
    "gpus_preferred": "gpu_count_preferred",
    "gpu_memory": "gpu_memory_mib_min",
    "gpu_memory_preferred": "gpu_memory_mib_preferred",
    "gpu_driver_min": "gpu_driver_version_min",
    "cuda_min": "gpu_cuda_version_min",
    "compute_capability_min": "gpu_compute_capability_min",
    "trust_level_min": "trust_level_min",
}
LIST_FLAGS = {  # repeatable flag attribute → inline resource list field
    "gpu_model": "gpu_models",
    "region": "regions",
    "region_preferred": "regions_preferred",
    "zone": "zones",
    "zone_preferred": "zones_preferred",
    "node_feature": "node_features_required",
}
SWITCH_FLAGS = {
    "gpu_interconnect": "gpu_interconnect_required",
    "warm_image": "warm_image_required",
}


def resources_from(args) -> dict:
    resources = {
        field: getattr(args, attr)
        for attr, field in RESOURCE_FLAGS.items()
        if getattr(args, attr, None) is not None
    }
    for attr, field in LIST_FLAGS.items():
        if getattr(args, attr, None):
            resources[field] = list(getattr(args, attr))
    for attr, field in SWITCH_FLAGS.items():
        if getattr(args, attr, False):
            resources[field] = True
    if resources.get("gpu_count") and "gpu_sharing_class" not in resources:
        resources["gpu_sharing_class"] = "exclusive"  # the one class that needs no share
    return resources


def volume_mount(text: str) -> dict:
    """`--volume ID:/path[:ro]` as the API's mount: {"volume", "path", "read_only"}."""
    volume, _, rest = text.partition(":")
    path, read_only = (rest[:-3], True) if rest.endswith(":ro") else (rest, False)
    if not volume.isdigit() or not path:
        raise UsageError(f"--volume {text!r}: write VOLUME_ID:/path, or VOLUME_ID:/path:ro")
    return {"volume": int(volume), "path": path, "read_only": read_only}


def merge(body: dict, args) -> dict:
    """The manifest's body with the flags given on the command line over it. A shape flag
    replaces inline resources and the other way round (the API takes exactly one)."""
    body = dict(body)
    for attr, field in (
        ("tenant", "tenant"),
        ("pool", "pool"),
        ("name", "name"),
        ("image", "image"),
        ("priority_class", "priority_class"),
        ("max_runtime", "max_runtime_s"),
        ("reservation", "reservation"),
        ("anti_affinity_scope", "anti_affinity_scope"),
    ):
        if getattr(args, attr, None) is not None:
            body[field] = getattr(args, attr)
    if args.command:
        body["command"] = list(args.command)
    for attr, field, flag in (
        ("env", "env", "--env"),
        ("label", "labels", "--label"),
        ("affinity", "affinity", "--affinity"),
        ("affinity_preferred", "affinity_preferred", "--affinity-preferred"),
        ("anti_affinity", "anti_affinity", "--anti-affinity"),
    ):
        extra = pairs(getattr(args, attr, None), flag)
        if extra:
            body[field] = {**(body.get(field) or {}), **extra}
    if args.checkpointable:
        body["checkpointable"] = True
    if getattr(args, "volume", None):
        body["volumes"] = [*(body.get("volumes") or []), *map(volume_mount, args.volume)]
    resources = resources_from(args)
    if args.shape:
        body["shape"] = args.shape
        body.pop("resources", None)
    elif resources:
        body["resources"] = {**(body.get("resources") or {}), **resources}
        body.pop("shape", None)
    return body
