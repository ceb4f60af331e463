"""A node's inventory: its registered form and the drift between two inventories (pure).

The format is the agent's schema (worker_agent/schemas/inventory-v1.json); a GPU's fields there
are GpuDevice columns, and its defaults are the schema's.
"""

import copy

from worker_agent.schema import GPU_KEYS, GPU_SCHEMA

from .conf import setting

GPU_FIELDS = tuple(key for key in GPU_KEYS if key != "index")
GPU_DEFAULTS = {
    key: spec["default"] for key, spec in GPU_SCHEMA["properties"].items() if "default" in spec
}


def normalize_inventory(inventory: dict) -> dict:
    """The registered form of an inventory: the schema's fields and defaults, in a stable order."""
    gpus = []
    for i, gpu in enumerate(inventory.get("gpus") or []):
        item = {field: gpu.get(field) for field in GPU_FIELDS if gpu.get(field) is not None}
        item = copy.deepcopy(GPU_DEFAULTS) | item
        item["index"] = gpu.get("index", i)
        gpus.append(item)
    return {
        "cpu_millicores": int(inventory.get("cpu_millicores") or 0),
        "memory_mib": int(inventory.get("memory_mib") or 0),
        "scratch_mib": int(inventory.get("scratch_mib") or 0),
        "numa": list(inventory.get("numa") or []),
        "gpus": sorted(gpus, key=lambda g: g["index"]),
    }


def gpu_model_fields(gpu: dict) -> dict:
    """One inventory GPU as GpuDevice column values."""
    fields = {field: gpu[field] for field in GPU_FIELDS if field in gpu}
    fields.setdefault("model", "")
    fields.setdefault("memory_mib", 0)
    fields["index"] = gpu["index"]
    return fields


GPU_DRIFT_FIELDS = (
    "model",
    "memory_mib",
    "mig_enabled",
    "driver_version",
    "cuda_version",
    "compute_capability",
)


def learned_capabilities(registered: dict, reported: dict) -> dict[str, str]:
    """uuid → compute capability the report gives for a registered GPU that had none: an agent
    that did not read them before (stored as they come, without drift)."""
    new = {
        g["uuid"]: g["compute_capability"]
        for g in reported.get("gpus") or ()
        if g.get("compute_capability")
    }
    return {
        g["uuid"]: new[g["uuid"]]
        for g in registered.get("gpus") or ()
        if not g.get("compute_capability") and g["uuid"] in new
    }


def mig_layout_of(gpu: dict) -> list[str]:
    """A GPU's MIG instances as "<profile>@<start>" (start "?" where not reported), sorted."""
    return sorted(
        f"{s.get('profile')}@{s.get('start', '?')}"
        for s in gpu.get("mig_slices") or ()
        if isinstance(s, dict)
    )


def inventory_drift(registered: dict, reported: dict) -> tuple[list[dict], bool]:
    """(differences, large?) between the registered and the reported inventory."""
    large_percent = setting("NODE_DRIFT_LARGE_PERCENT")
    diffs, large = [], False
    for field in ("cpu_millicores", "memory_mib", "scratch_mib"):
        before, after = int(registered.get(field) or 0), int(reported.get(field) or 0)
        if before != after:
            percent = round(100 * (after - before) / before, 1) if before else 100.0
            diffs.append({"field": field, "from": before, "to": after, "percent": percent})
            if field != "scratch_mib" and percent < -large_percent:
                large = True
    old = {g["uuid"]: g for g in registered.get("gpus") or []}
    new = {g["uuid"]: g for g in reported.get("gpus") or []}
    for uuid, gpu in old.items():
        if uuid not in new:
            diffs.append(
                {"field": "gpu", "uuid": uuid, "change": "gone", "model": gpu.get("model")}
            )
            large = True
            continue
        for field in GPU_DRIFT_FIELDS:
            if field == "compute_capability" and not gpu.get(field):
                continue  # first reported (an agent from before it read them): learned, no drift
            if gpu.get(field) != new[uuid].get(field):
                diffs.append(
                    {
                        "field": f"gpu.{field}",
                        "uuid": uuid,
                        "from": gpu.get(field),
                        "to": new[uuid].get(field),
                    }
                )
                if field in ("model", "memory_mib"):
                    large = True
    for uuid, gpu in old.items():  # the MIG layout the agent read (the scheduler places on it)
        if uuid in new and mig_layout_of(gpu) != mig_layout_of(new[uuid]):
            diffs.append(
                {
                    "field": "gpu.mig_slices",
                    "uuid": uuid,
                    "from": mig_layout_of(gpu),
                    "to": mig_layout_of(new[uuid]),
                }
            )
    for uuid in new.keys() - old.keys():
        diffs.append({"field": "gpu", "uuid": uuid, "change": "added", "model": new[uuid]["model"]})
    return diffs, large


def describe_drift(diff: dict) -> str:
    """One difference from `inventory_drift`, in words."""
    if diff.get("change"):
        return f"gpu {diff['uuid']} ({diff.get('model')}) {diff['change']}"
    where = f"{diff['field']} of {diff['uuid']}" if diff.get("uuid") else diff["field"]
    return f"{where}: {diff['from']} → {diff['to']}"
