"""The console's submit form, translated into the API's body: the console validates a job with
the API's own JobSubmitSerializer (one validator), so this module only turns form text (a
command line, one URL per line, `KEY=value` lines, comma lists) into the JSON the API takes,
and the serializer's nested errors back into one message per form field."""

from __future__ import annotations

import shlex

from pools import validation

# Custom shape fields offered by the form (the rest of a shape keeps its defaults).
RESOURCE_FIELDS = (
    "cpu_millicores_min",
    "cpu_millicores_preferred",
    "memory_mib_min",
    "memory_mib_preferred",
    "gpu_count",
    "gpu_sharing_class",
    "gpu_milli",
    "gpu_models",
    "scratch_mib",
    "gpu_count_preferred",
    "gpu_memory_mib_min",
    "gpu_memory_mib_preferred",
    "gpu_driver_version_min",
    "gpu_cuda_version_min",
    "regions",
    "regions_preferred",
    "zones",
    "zones_preferred",
    "trust_level_min",
    "gpu_compute_capability_min",
    "node_features_required",
)
LIST_FIELDS = (
    "gpu_models",
    "regions",
    "regions_preferred",
    "zones",
    "zones_preferred",
    "node_features_required",
)
CHECKBOX_FIELDS = ("gpu_interconnect_required", "warm_image_required")
RETRY_REASONS = validation.RETRY_REASONS


def _split(text: str) -> list[str]:
    return [item for item in text.replace(",", " ").split() if item]


def _pairs(text: str, field: str, errors: dict) -> dict:
    """`KEY=value` lines as a mapping; a line without `=` is the field's error."""
    pairs = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            errors[field] = f"Line {number}: write KEY=value."
            return {}
        pairs[key.strip()] = value.strip()
    return pairs


def _mounts(text: str, errors: dict) -> list[dict]:
    """`<volume id>:<path>[:ro]` lines as the API's `volumes` (docs/storage.md)."""
    mounts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        volume, _, rest = line.strip().partition(":")
        path, _, mode = rest.rpartition(":") if rest.endswith((":ro", ":rw")) else (rest, "", "")
        if not volume.isdigit() or not path:
            errors["volumes"] = f"Line {number}: write <volume id>:<path>, or …:<path>:ro."
            return []
        mounts.append({"volume": int(volume), "path": path, "read_only": mode == "ro"})
    return mounts


def submit_body(post) -> tuple[dict, dict]:
    """(the API's submit body, errors of the text itself keyed by form field)."""
    errors: dict[str, str] = {}
    body = {key: post.get(key, "") for key in ("tenant", "pool", "name", "image")}
    body["output_destination"] = post.get("output_destination", "")
    body["max_runtime_s"] = post.get("max_runtime_s") or 3600
    body["checkpointable"] = post.get("checkpointable") == "on"
    if post.get("priority_class"):
        body["priority_class"] = post["priority_class"]
    if post.get("shape_mode", "catalogue") == "catalogue":
        body["shape"] = post.get("shape", "")
    else:
        resources = {}
        for field in RESOURCE_FIELDS:
            value = post.get(field, "").strip()
            if value:
                resources[field] = _split(value) if field in LIST_FIELDS else value
        for field in CHECKBOX_FIELDS:
            if post.get(field) == "on":
                resources[field] = True
        body["resources"] = resources
    try:
        body["command"] = shlex.split(post.get("command", ""))
    except ValueError as exc:  # an unclosed quote
        errors["command"] = f"Not a command line: {exc}."
    body["inputs"] = [line.strip() for line in post.get("inputs", "").splitlines() if line.strip()]
    if mounts := _mounts(post.get("volumes", ""), errors):
        body["volumes"] = mounts
    ports = _split(post.get("ports", ""))
    if all(port.isdigit() for port in ports):
        body["ports"] = [int(port) for port in ports]
    else:
        errors["ports"] = "Port numbers, separated by commas or spaces."
    # node labels, the job's own labels, workload labels to avoid: KEY=value lines
    for field in ("affinity", "affinity_preferred", "labels", "anti_affinity"):
        if pairs := _pairs(post.get(field, ""), field, errors):
            body[field] = pairs
    if post.get("anti_affinity_scope"):  # host | zone, checked by the serializer
        body["anti_affinity_scope"] = post["anti_affinity_scope"]
    body["env"] = _pairs(post.get("env", ""), "env", errors)
    body["secrets"] = _pairs(post.get("secrets", ""), "secrets", errors)
    network = {"mode": post.get("network_mode") or "none"}
    if egress := _split(post.get("egress_allow", "")):
        network["egress_allow"] = egress
    if sources := _split(post.get("ingress_allow", "")):
        network["ingress_allow"] = sources
    body["network_policy"] = network
    retry = {"retry_on": post.getlist("retry_on")}
    for key in ("max_attempts", "backoff_s"):
        value = post.get(f"retry_{key}", "").strip()
        if value:
            if not value.isdigit():
                errors[f"retry_{key}"] = "A whole number."
                continue
            retry[key] = int(value)
    body["retry_policy"] = retry
    if post.get("require_numa") == "on":
        body["require_numa"] = True
    # a gang: all three fields or none (the serializer checks the values)
    gang = {key: post.get(f"gang_{key}", "").strip() for key in ("name", "size", "topology")}
    if gang["name"] or gang["size"]:
        if not gang["size"].isdigit():
            errors["gang_size"] = "A whole number: how many jobs the gang has."
        else:
            body["gang"] = {
                "name": gang["name"],
                "size": int(gang["size"]),
                "topology": gang["topology"] or "none",
            }
    reservation = post.get("reservation", "").strip()
    if reservation:
        if reservation.isdigit():
            body["reservation"] = int(reservation)
        else:
            errors["reservation"] = "A reservation's number."
    return body, errors


def field_errors(detail) -> dict[str, str]:
    """The serializer's errors as {form field: message}: an inline shape's fields by their own
    names, a network or retry policy at its first field, the rest under "form"."""
    where = {
        "gang": "gang_name",
        "network_policy": "network_mode",
        "retry_policy": "retry_max_attempts",
        "non_field_errors": "form",
    }
    errors = {}
    for field, messages in detail.items():
        if field == "resources" and isinstance(messages, dict):  # {field: [messages]}
            errors.update(field_errors(messages))
            continue
        errors[where.get(field, field)] = " ".join(_flat(messages))
    return errors


def _flat(messages, where: str = "") -> list[str]:
    """Messages of a field, nested ones (an input's URL, an egress entry) named by their
    place: {"1": {"url": ["…"]}} → ["1 url: …"]."""
    if isinstance(messages, dict):
        return [m for key, value in messages.items() for m in _flat(value, f"{where}{key} ")]
    if isinstance(messages, list | tuple):
        return [m for value in messages for m in _flat(value, where)]
    return [f"{where.strip()}: {messages}" if where else str(messages)]
