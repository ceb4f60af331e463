"""Type and range rules for values people send: resource shapes and job bodies.

One place for each rule: ResourceShape.clean() (the admin, and the API's resource requests, which
run the shape's clean) and the API serializers use these, so the scheduler only ever sees values
it can handle. Raise Django's ValidationError; DRF turns it into 400 field errors. A job's network
policy has its own module (pools/network_rules.py); a policy version's knobs are checked by their
declarations (pools/knobs.py `policy_version`).
"""

import math
import re
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ValidationError

from placement.types import GANG_TOPOLOGIES
from pools.objectstore import parse_url

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

# The data plane's job fields (docs/data-plane.md): secrets by name, inputs, ports, network and
# retry policies, where outputs go.
SECRETS_MAX_ENTRIES = 64
SECRET_NAME = re.compile(r"[-a-zA-Z0-9_]+", re.ASCII)  # a slug
SECRET_NAME_MAX_CHARS = 100
SECRET_VALUE_MAX_BYTES = 64 * 1024
INPUTS_MAX_ITEMS = 32
INPUT_URL_MAX_CHARS = 2048
FILE_NAME_MAX_CHARS = 255
PORTS_MAX_ITEMS = 16
RETRY_MAX_ATTEMPTS = 10
RETRY_BACKOFF_MAX_S = 86400
# the ends of an attempt a retry policy may retry (reason codes, pools/reasons.py)
RETRY_REASONS = (
    "node_lost",
    "oom_killed",
    "exited_nonzero",
    "startup_timed_out",
    "image_pull_failed",
    "runtime_error",
    "runtime_unavailable",
    "capacity_vanished",  # its node's reported capacity shrank under it (jobs/receivers.py)
    "backfill_window_closed",  # a backfill that could not checkpoint, reclaimed at the window
)
OUTPUT_DESTINATION_MAX_CHARS = 300

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


VERSION = re.compile(r"\d{1,6}(\.\d{1,6}){0,3}")
# A CUDA compute capability, "major.minor" ("8.0", "10.0"), as the agents report it
COMPUTE_CAPABILITY = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")


# A node feature ("avx512", "infiniband", "sgx"): what a node's agent reports (Node.features) and
# what a shape's node_features_required names, one short lowercase token each.
FEATURE = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}", re.ASCII)
FEATURES_REQUIRED_MAX = 16  # in one request
NODE_FEATURES_MAX = 64  # on one node


def feature_list(value, *, max_items: int) -> list[str]:
    """A list of at most `max_items` distinct feature names (FEATURE: a lowercase letter or digit,
    then up to 39 of letters, digits, `.`, `_`, `-`). Anything else is refused, never
    normalised: a feature name is compared as it is written."""
    if not isinstance(value, list):
        raise ValidationError('A list of feature names, e.g. ["avx512"].')
    if len(value) > max_items:
        raise ValidationError(f"At most {max_items} features.")
    for item in value:
        if not isinstance(item, str) or not FEATURE.fullmatch(item):
            shown = repr(item)[:50]
            raise ValidationError(
                f"{shown}: a feature name is 1 to 40 characters of a-z, 0-9, '.', '_', '-', "
                "starting with a letter or digit."
            )
    if len(set(value)) < len(value):
        raise ValidationError("Each feature is named once.")
    return value


def shape_errors(shape) -> dict[str, list[str]]:
    """What the columns alone do not refuse: list fields and the GPU count's ceiling."""
    errors = {}
    for field in ("gpu_models", "regions", "zones", "regions_preferred", "zones_preferred"):
        try:
            string_list(getattr(shape, field))
        except ValidationError as exc:
            errors[field] = exc.messages
    for field in ("gpu_count", "gpu_count_preferred"):
        count = getattr(shape, field)
        if isinstance(count, int) and count > GPU_COUNT_MAX:
            errors[field] = [f"At most {GPU_COUNT_MAX} GPUs."]
    for field in ("gpu_driver_version_min", "gpu_cuda_version_min"):
        value = getattr(shape, field)
        if value and not VERSION.fullmatch(value):
            errors[field] = ['A version of dot-separated numbers, e.g. "535.104".']
    capability = shape.gpu_compute_capability_min
    if capability and not COMPUTE_CAPABILITY.fullmatch(capability):
        errors["gpu_compute_capability_min"] = ['A compute capability "major.minor", e.g. "8.0".']
    try:
        feature_list(shape.node_features_required, max_items=FEATURES_REQUIRED_MAX)
    except ValidationError as exc:
        errors["node_features_required"] = exc.messages
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


# A job's labels and its placement selectors (docs/scheduler.md "Labels and affinity"): maps of
# label key to value, Kubernetes-style keys ("team", "computepool.io/gpu-class").
LABELS_MAX_ENTRIES = 32
LABEL_KEY_MAX_CHARS = 128
LABEL_VALUE_MAX_CHARS = 128
LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?", re.ASCII)
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?", re.ASCII)


def anti_affinity_scope(scope: str, *, anti_affinity, gang) -> str:
    """A job's `anti_affinity_scope`: "host" (the node's own work) or "zone" (the work of every
    node of the node's zone), "zone" only beside `anti_affinity` (the labels it avoids) and not
    for a gang's jobs (a gang spreads its replicas by its topology, `spread_zones`)."""
    if scope == "zone" and not anti_affinity:
        raise ValidationError("Scope zone needs anti_affinity: the labels to avoid in the zone.")
    if scope == "zone" and gang:
        raise ValidationError(
            "Scope zone is for jobs that are not gangs: a gang spreads by its topology."
        )
    return scope


def label_map(value) -> dict[str, str]:
    """A job's `labels`, `affinity` or `anti_affinity`: at most LABELS_MAX_ENTRIES entries of
    label key to string value (keys ≤ 128 characters of letters, digits, `.`, `_`, `-`, `/`,
    starting and ending alphanumeric; values ≤ 128 characters of letters, digits, `.`, `_`,
    `-`, possibly empty). Returns it as a plain dict."""
    if not isinstance(value, dict):
        raise ValidationError("A map of label key to value.")
    if len(value) > LABELS_MAX_ENTRIES:
        raise ValidationError(f"At most {LABELS_MAX_ENTRIES} labels.")
    out = {}
    for key, item in value.items():
        if (
            not isinstance(key, str)
            or len(key) > LABEL_KEY_MAX_CHARS
            or not LABEL_KEY.fullmatch(key)
        ):
            raise ValidationError(
                f"{str(key)[:LABEL_KEY_MAX_CHARS]!r}: a label key has at most "
                f"{LABEL_KEY_MAX_CHARS} letters, digits, '.', '_', '-' or '/', starting and "
                "ending with a letter or digit."
            )
        if (
            not isinstance(item, str)
            or len(item) > LABEL_VALUE_MAX_CHARS
            or not LABEL_VALUE.fullmatch(item)
        ):
            raise ValidationError(
                f"{key}: a label value is a string of at most {LABEL_VALUE_MAX_CHARS} letters, "
                "digits, '.', '_' or '-', starting and ending with a letter or digit."
            )
        out[key] = item
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def secret_name(value) -> None:
    """A tenant secret's name: a slug of at most SECRET_NAME_MAX_CHARS."""
    if not isinstance(value, str) or not SECRET_NAME.fullmatch(value):
        raise ValidationError("A secret name is a slug: letters, digits, - and _.")
    if len(value) > SECRET_NAME_MAX_CHARS:
        raise ValidationError(f"At most {SECRET_NAME_MAX_CHARS} characters.")


def secret_value(value) -> None:
    """A secret's value becomes a file of the job: text of at most 64 KiB (UTF-8)."""
    if not isinstance(value, str) or not value:
        raise ValidationError("A non-empty string.")
    if len(value.encode()) > SECRET_VALUE_MAX_BYTES:
        raise ValidationError(f"At most {SECRET_VALUE_MAX_BYTES} bytes.")
    if "\x00" in value:
        raise ValidationError("NUL characters are not allowed.")


def secrets_mapping(value) -> None:
    """A job's `secrets`: {NAME: secret name}, at most SECRETS_MAX_ENTRIES. NAME is the file
    /run/secrets/NAME and the variable NAME_FILE: an environment-variable name, so always a
    plain file name (no '/', '.' or '..'). Whether the secrets exist is the tenant's question
    (the serializer asks it)."""
    if not isinstance(value, dict):
        raise ValidationError("A map of file name (NAME: /run/secrets/NAME) to secret name.")
    if len(value) > SECRETS_MAX_ENTRIES:
        raise ValidationError(f"At most {SECRETS_MAX_ENTRIES} secrets.")
    env_mapping(value)
    for key, name in value.items():
        try:
            secret_name(name)
        except ValidationError as exc:
            raise ValidationError(f"{key}: {exc.messages[0]}") from None


def file_name(value) -> None:
    """A plain file name (outputs, inputs): never a path, so it cannot leave its folder."""
    if not isinstance(value, str) or not value:
        raise ValidationError("A non-empty file name.")
    if len(value) > FILE_NAME_MAX_CHARS:
        raise ValidationError(f"At most {FILE_NAME_MAX_CHARS} characters.")
    if "/" in value or "\\" in value or value in (".", "..") or ".." in value:
        raise ValidationError("A plain file name: no '/', '\\' or '..'.")
    if _CONTROL.search(value):
        raise ValidationError("Control characters are not allowed.")


def _http_url(url) -> str | None:
    """What is wrong with an input's URL, or None."""
    if not isinstance(url, str) or not url:
        return "a URL is a non-empty string"
    if len(url) > INPUT_URL_MAX_CHARS:
        return f"a URL has at most {INPUT_URL_MAX_CHARS} characters"
    if _CONTROL.search(url) or " " in url:
        return "a URL has no spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError:
        return "not a valid URL"
    if url.startswith("s3://"):
        return _s3_input_url(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "only http(s) URLs with a host, or s3://bucket/key of a registered bucket"
    return None


def _s3_input_url(url: str) -> str | None:
    """What is wrong with an `s3://bucket/key` input (an object, not a prefix), or None."""
    try:
        _, key = parse_url(url)
    except ValueError as exc:
        return str(exc).rstrip(".")
    if not key or key.endswith("/"):
        return "an s3:// input names one object: s3://bucket/key"
    return None


def job_inputs(value) -> list[dict]:
    """A job's `inputs`: URLs (or {"url", "name"}) fetched into /inputs/<name> before start.
    The name defaults to the URL's last path segment; names are unique."""
    if not isinstance(value, list):
        raise ValidationError("A list of http(s) URLs or {url, name} objects.")
    if len(value) > INPUTS_MAX_ITEMS:
        raise ValidationError(f"At most {INPUTS_MAX_ITEMS} inputs.")
    inputs, names = [], set()
    for index, item in enumerate(value):
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, dict) or not set(item) <= {"url", "name"}:
            raise ValidationError(f"Input {index}: a URL or an object with url and name only.")
        url = item.get("url")
        if problem := _http_url(url):
            raise ValidationError(f"Input {index}: {problem}.")
        name = item.get("name")
        if name is None:
            name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        try:
            file_name(name)
        except ValidationError as exc:
            raise ValidationError(
                f"Input {index}: name {name[:40]!r}: {exc.messages[0]} Give a name."
                if isinstance(name, str)
                else f"Input {index}: the name is a string."
            ) from None
        if name in names:
            raise ValidationError(f"Input {index}: the name {name!r} is used twice.")
        names.add(name)
        inputs.append({"url": url, "name": name})
    return inputs


def job_ports(value) -> list[int]:
    """A job's `ports`: at most PORTS_MAX_ITEMS distinct container ports."""
    if not isinstance(value, list):
        raise ValidationError("A list of port numbers.")
    if len(value) > PORTS_MAX_ITEMS:
        raise ValidationError(f"At most {PORTS_MAX_ITEMS} ports.")
    for port in value:
        if not _is_int(port) or not 1 <= port <= 65535:
            raise ValidationError(f"{str(port)[:20]!r}: ports are integers from 1 to 65535.")
    if len(set(value)) != len(value):
        raise ValidationError("Each port once.")
    return value


# A job's persistent volume mounts (docs/storage.md "Persistent volumes")
VOLUME_MOUNTS_MAX = 8
VOLUME_PATH_MAX_CHARS = 200
# what the agent mounts itself: a volume is never mounted at, above or inside one of these
VOLUME_RESERVED_PATHS = ("/outputs", "/scratch", "/inputs", "/secrets", "/run/secrets", "/tmp")
# the image's system directories: never at or inside one (nor "/" itself)
VOLUME_SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var",
)  # fmt: skip
_VOLUME_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+", re.ASCII)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def volume_path(path) -> str:
    """An absolute, normal path (no `.`/`..`, no trailing slash, plain characters) that is not
    a system directory or inside one, and neither at, above nor inside what the agent mounts."""
    if not isinstance(path, str) or not path or len(path) > VOLUME_PATH_MAX_CHARS:
        raise ValidationError(f"An absolute path of at most {VOLUME_PATH_MAX_CHARS} characters.")
    if not _VOLUME_PATH.fullmatch(path) or any(p in (".", "..") for p in path.split("/")):
        raise ValidationError(
            f"{path[:60]!r}: an absolute path such as /data, of letters, digits, '.', '_', '-'."
        )
    for taken in VOLUME_RESERVED_PATHS:
        if _inside(path, taken) or _inside(taken, path):
            raise ValidationError(f"{path}: {taken} is the agent's; mount elsewhere, e.g. /data.")
    for system in VOLUME_SYSTEM_DIRS:
        if _inside(path, system):
            raise ValidationError(f"{path}: inside the system directory {system}.")
    return path


def job_volumes(value) -> list[dict]:
    """A job's `volumes`: at most VOLUME_MOUNTS_MAX `{"volume": id, "path": "/data",
    "read_only": false}`, each volume once, no path at or inside another. Whether each volume
    is the tenant's own is the submit's to check (jobs/api/serializers.py)."""
    if not isinstance(value, list):
        raise ValidationError('A list of {"volume": id, "path": "/data", "read_only": false}.')
    if len(value) > VOLUME_MOUNTS_MAX:
        raise ValidationError(f"At most {VOLUME_MOUNTS_MAX} volume mounts.")
    mounts = []
    for index, entry in enumerate(value):
        if not isinstance(entry, dict) or set(entry) - {"volume", "path", "read_only"}:
            raise ValidationError(f"Mount {index}: an object of volume, path and read_only.")
        volume, read_only = entry.get("volume"), entry.get("read_only", False)
        if not _is_int(volume) or not 1 <= volume <= BIGINT_MAX:
            raise ValidationError(f"Mount {index}: volume is a volume's id.")
        if not isinstance(read_only, bool):
            raise ValidationError(f"Mount {index}: read_only is true or false.")
        try:
            path = volume_path(entry.get("path"))
        except ValidationError as error:
            raise ValidationError(f"Mount {index}: {error.messages[0]}") from None
        for other in mounts:
            if other["volume"] == volume:
                raise ValidationError(f"Mount {index}: volume {volume} is mounted twice.")
            if _inside(path, other["path"]) or _inside(other["path"], path):
                raise ValidationError(f"Mount {index}: {path} overlaps {other['path']}.")
        mounts.append({"volume": volume, "path": path, "read_only": read_only})
    return mounts


def retry_policy(value) -> dict:
    """A job's `retry_policy`; keys left out keep their defaults (one attempt, 30 s backoff,
    retry when the node is lost)."""
    if not isinstance(value, dict):
        raise ValidationError("An object: max_attempts, backoff_s, retry_on.")
    policy = {"max_attempts": 1, "backoff_s": 30, "retry_on": ["node_lost"]}
    unknown = sorted(set(value) - set(policy))
    if unknown:
        raise ValidationError(f"Unknown keys: {', '.join(unknown)[:200]}.")
    policy |= value
    attempts, backoff, retry_on = policy["max_attempts"], policy["backoff_s"], policy["retry_on"]
    if not _is_int(attempts) or not 1 <= attempts <= RETRY_MAX_ATTEMPTS:
        raise ValidationError(f"max_attempts is an integer from 1 to {RETRY_MAX_ATTEMPTS}.")
    if not _is_int(backoff) or not 0 <= backoff <= RETRY_BACKOFF_MAX_S:
        raise ValidationError(f"backoff_s is an integer from 0 to {RETRY_BACKOFF_MAX_S}.")
    if (
        not isinstance(retry_on, list)
        or not all(isinstance(reason, str) and reason in RETRY_REASONS for reason in retry_on)
        or len(set(retry_on)) != len(retry_on)
    ):
        raise ValidationError(f"retry_on lists distinct reasons among {', '.join(RETRY_REASONS)}.")
    return policy


# A job's gang (docs/scheduler.md "Gangs of jobs"): separate jobs of one tenant in one pool that
# share a name and are placed all or none.
GANG_NAME = re.compile(r"[-a-zA-Z0-9_]{1,60}", re.ASCII)  # a slug
GANG_SIZE_MIN, GANG_SIZE_MAX = 2, 64


def job_gang(value) -> dict:
    """A job's `gang`: {} for none, else {"name": a slug of at most 60 characters, "size": 2 to
    64 members, "topology": one of the core's GANG_TOPOLOGIES (default "none")}."""
    if not isinstance(value, dict):
        raise ValidationError('An object: {"name", "size", "topology"}.')
    if not value:
        return {}
    unknown = sorted(set(value) - {"name", "size", "topology"})
    if unknown:
        raise ValidationError(f"Unknown keys: {', '.join(map(str, unknown))[:200]}.")
    name, size = value.get("name"), value.get("size")
    topology = value.get("topology", GANG_TOPOLOGIES[0])
    if not isinstance(name, str) or not GANG_NAME.fullmatch(name):
        raise ValidationError("name is a slug of 1 to 60 letters, digits, '-' or '_'.")
    if not _is_int(size) or not GANG_SIZE_MIN <= size <= GANG_SIZE_MAX:
        raise ValidationError(f"size is an integer from {GANG_SIZE_MIN} to {GANG_SIZE_MAX}.")
    if topology not in GANG_TOPOLOGIES:
        raise ValidationError(f"topology is one of {', '.join(GANG_TOPOLOGIES)}.")
    return {"name": name, "size": size, "topology": topology}


def output_destination(value) -> str:
    """Where outputs go: "" is the control plane's artifact storage; `s3://bucket/prefix/` a
    bucket the tenant registered (checked against the tenant's buckets by the job serializer),
    normalised with a trailing "/" after a non-empty prefix."""
    if not isinstance(value, str) or len(value) > OUTPUT_DESTINATION_MAX_CHARS:
        raise ValidationError(f"A string of at most {OUTPUT_DESTINATION_MAX_CHARS} characters.")
    if value.startswith("s3://"):
        try:
            bucket, prefix = parse_url(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return f"s3://{bucket}/{prefix}"
    if value:
        raise ValidationError(
            'Leave it empty ("") for the control plane\'s artifact storage, or name a registered '
            "bucket: s3://bucket/prefix/."
        )
    return value


# The largest value of a PostgreSQL bigint: ids, fencing tokens, counters.
BIGINT_MAX = 2**63 - 1


# A node's price per hour and energy class (nodes' enrollment checks them; the snapshot reads
# them for the `price` scorer, leases/node_views.py).
_PRICE_MAX = 1e6
_ENERGY_LETTERS = "ABCDEFG"


def parse_price(text) -> float | None:
    """A price per hour: a finite number 0 … 1e6, or None when it is not one."""
    try:
        price = float(str(text).strip())
    except (TypeError, ValueError):
        return None
    return price if math.isfinite(price) and 0 <= price <= _PRICE_MAX else None


def parse_energy_class(text) -> int | None:
    """0…9, or A…G as 0…6 (0 = A = most efficient); None when it does not parse."""
    raw = str(text).strip()
    if len(raw) == 1 and raw.upper() in _ENERGY_LETTERS:
        return _ENERGY_LETTERS.index(raw.upper())
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) <= 9 else None
