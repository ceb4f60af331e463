"""Type and range rules for values people send: resource shapes, job bodies, policy versions.

One place for each rule: ResourceShape.clean() (the admin, and the API's resource requests, which
run the shape's clean) and the API serializers use these, so the scheduler only ever sees values
it can handle. Raise Django's ValidationError; DRF turns it into 400 field errors.
"""

import ipaddress
import re
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ValidationError

from placement import policy_problems
from placement.queue import QUEUE_KNOBS
from placement.types import GANG_TOPOLOGIES
from pools.choices import RUNTIME_STRENGTH, ContainerRuntime, DrainPolicy
from worker_agent.addresses import ALWAYS_REFUSED, host_refusal

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
NETWORK_MODES = ("none", "pool")
EGRESS_MAX_ENTRIES = 64
EGRESS_ENTRY_MAX_CHARS = 261  # a 253-character host name, ":" and a port
INGRESS_MAX_ENTRIES = 64
EGRESS_ALLOWED_MAX_ENTRIES = 256
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
)
OUTPUT_DESTINATION_MAX_CHARS = 300
# /outputs is a filesystem of this many MiB on the node (job field and pool knob
# output_limit_mib; the knob's 0: the pool's jobs get no output limit, which only the process
# runtime runs and the Docker runtime refuses)
OUTPUT_LIMIT_DEFAULT_MIB = 1024
OUTPUT_LIMIT_MAX_MIB = 1024 * 1024
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)

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


# A job's labels and its placement selectors (docs/scheduler.md "Labels and affinity"): maps of
# label key to value, Kubernetes-style keys ("team", "computepool.io/gpu-class").
LABELS_MAX_ENTRIES = 32
LABEL_KEY_MAX_CHARS = 128
LABEL_VALUE_MAX_CHARS = 128
LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?", re.ASCII)
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?", re.ASCII)


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
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "only http(s) URLs with a host"
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


def _egress_entry(entry) -> str | None:
    """What is wrong with an egress allow-list entry (host[:port], [IPv6][:port]), or None."""
    if not isinstance(entry, str) or not entry or len(entry) > EGRESS_ENTRY_MAX_CHARS:
        return f"a host[:port] string of at most {EGRESS_ENTRY_MAX_CHARS} characters"
    host, port = entry, None
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                return "[IPv6]:port"
            port = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address"
    elif ":" in entry:
        host, port = entry.rsplit(":", 1)
    if port is not None and (
        not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535
    ):
        return "the port is a number from 1 to 65535"
    if not entry.startswith("["):
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
            return "not a host name or IPv4 address"
    return None


def network_policy(value) -> dict:
    """A job's `network_policy`: {"mode": "none"} (no network) or {"mode": "pool",
    "egress_allow": [host[:port], …], "ingress_allow": [source CIDR, …]} (the pool network,
    egress only to those; its published ports reached only from those sources, any when
    none). Whether the pool lets these addresses be reached is the submit's question
    (jobs/networks.py)."""
    if not isinstance(value, dict):
        raise ValidationError('An object: {"mode": "none"|"pool", "egress_allow": [...]}.')
    unknown = sorted(set(value) - {"mode", "egress_allow", "ingress_allow"})
    if unknown:
        raise ValidationError(f"Unknown keys: {', '.join(unknown)[:200]}.")
    mode = value.get("mode", "none")
    if mode not in NETWORK_MODES:
        raise ValidationError(f"mode is one of {', '.join(NETWORK_MODES)}.")
    egress = value.get("egress_allow", [])
    if not isinstance(egress, list):
        raise ValidationError("egress_allow is a list of host[:port].")
    if egress and mode != "pool":
        raise ValidationError('egress_allow needs mode "pool": mode "none" has no network.')
    if len(egress) > EGRESS_MAX_ENTRIES:
        raise ValidationError(f"egress_allow has at most {EGRESS_MAX_ENTRIES} entries.")
    for entry in egress:
        if problem := _egress_entry(entry):
            raise ValidationError(f"egress_allow {str(entry)[:60]!r}: {problem}.")
    policy = {"mode": mode, "egress_allow": egress}
    if "ingress_allow" in value:
        policy["ingress_allow"] = ingress_allow(value["ingress_allow"], mode)
    return policy


def ingress_allow(value, mode: str) -> list[str]:
    """Source CIDRs of a job's published ports (IPv4: the pool network is IPv4 only),
    normalised ("10.0.0.7" → "10.0.0.7/32")."""
    if not isinstance(value, list) or len(value) > INGRESS_MAX_ENTRIES:
        raise ValidationError(f"ingress_allow is a list of at most {INGRESS_MAX_ENTRIES} CIDRs.")
    if value and mode != "pool":
        raise ValidationError('ingress_allow needs mode "pool": mode "none" has no network.')
    out = []
    for entry in value:
        try:
            network = ipaddress.IPv4Network(entry, strict=False) if isinstance(entry, str) else None
        except ValueError:
            network = None
        if network is None:
            raise ValidationError(f"ingress_allow {str(entry)[:60]!r}: an IPv4 CIDR.")
        out.append(str(network))
    return list(dict.fromkeys(out))


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
    """Where outputs go: "" is the control plane's artifact storage (the only one so far)."""
    if not isinstance(value, str) or len(value) > OUTPUT_DESTINATION_MAX_CHARS:
        raise ValidationError(f"A string of at most {OUTPUT_DESTINATION_MAX_CHARS} characters.")
    if value.startswith("s3://"):
        raise ValidationError("S3 output destinations need OUTPUT_S3_* settings.")
    if value:
        raise ValidationError('Leave it empty ("") for the control plane\'s artifact storage.')
    return value


def _reservation_seconds(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of seconds"
    if not 1 <= value <= RESERVATION_KNOB_MAX_S:
        return f"between 1 and {RESERVATION_KNOB_MAX_S} s"
    return None


def _drain_policy(value) -> str | None:
    return None if value in DrainPolicy.values else f"one of {', '.join(DrainPolicy.values)}"


# A pool's `required_runtime`: "" (none required), or the weakest runtime its jobs may run under.
REQUIRED_RUNTIMES = ("", ContainerRuntime.DOCKER, ContainerRuntime.GVISOR)


def _required_runtime(value) -> str | None:
    return None if value in REQUIRED_RUNTIMES else 'one of "", "docker", "gvisor"'


def runtime_below(runtime: str, required: str) -> bool:
    """Whether `runtime` isolates less than a pool's `required_runtime` asks ("" asks nothing)."""
    if not required:
        return False
    return RUNTIME_STRENGTH.get(runtime or ContainerRuntime.DOCKER, -1) < RUNTIME_STRENGTH[required]


def _boolean(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


# The agent's timings (jobs/lifecycle.py, defaults there): how long a container may take to
# start, and the grace period between the stop signal and the kill.
AGENT_TIMEOUT_MAX_S = 86400


# Retention of an ended job's outputs and logs (jobs/artifacts.py, default there: 30 days).
RETENTION_MAX_DAYS = 3650


def _retention_days(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of days"
    if not 1 <= value <= RETENTION_MAX_DAYS:
        return f"between 1 and {RETENTION_MAX_DAYS} days"
    return None


def _output_limit(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of MiB"
    if not 0 <= value <= OUTPUT_LIMIT_MAX_MIB:
        return f"between 0 (no limit) and {OUTPUT_LIMIT_MAX_MIB} MiB"
    return None


def _agent_seconds(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of seconds"
    if not 1 <= value <= AGENT_TIMEOUT_MAX_S:
        return f"between 1 and {AGENT_TIMEOUT_MAX_S} s"
    return None


def _protection_seconds(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "an integer number of seconds"
    if not 0 <= value <= AGENT_TIMEOUT_MAX_S:
        return f"between 0 and {AGENT_TIMEOUT_MAX_S} s"
    return None


CREDIT_RATE_KEYS = frozenset({"cpu_core_hour", "memory_gib_hour", "gpu_hour", "consumed_factor"})


def _credit_rates(value) -> str | None:
    """{class name or "default": {rate name: a non-negative number}} (leases/services/credits)."""
    what = f'a map of priority class (or "default") to rates among {sorted(CREDIT_RATE_KEYS)}'
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        return what
    for rates in value.values():
        for key, rate in rates.items():
            number = isinstance(rate, int | float) and not isinstance(rate, bool)
            if key not in CREDIT_RATE_KEYS or not number or not 0 <= rate <= 1e9:
                return what + ", each a number from 0 to 1e9"
    return None


def _egress_allowed(value) -> str | None:
    """CIDRs and host names a tenant's egress_allow may name (jobs/networks.py); none inside an
    always-refused range (loopback, link-local, …), no name of the loopback."""
    what = f"a list of at most {EGRESS_ALLOWED_MAX_ENTRIES} CIDRs and host names"
    if not isinstance(value, list) or len(value) > EGRESS_ALLOWED_MAX_ENTRIES:
        return what
    for entry in value:
        if not isinstance(entry, str) or not entry:
            return what
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if _egress_entry(entry) is not None or ":" in entry or host_refusal(entry):
                return f"{what} ({entry[:60]!r} is neither)"
            continue
        for why, nets in ALWAYS_REFUSED.items():  # a wider range may hold them: still refused
            refused = [ipaddress.ip_network(net) for net in nets]
            if any(n.version == network.version and network.subnet_of(n) for n in refused):
                return f"{what}, never {why} ({entry[:60]!r})"
    return None


def _ingress_address(value) -> str | None:
    """Where published ports bind: "node" (the agent's route address) or one address."""
    what = '"node" or an IPv4/IPv6 address (not a wildcard or multicast)'
    if value == "node":
        return None
    try:
        address = ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        address = None
    if address is None or address.is_unspecified or address.is_multicast:
        return what
    return None


# The largest value of a PostgreSQL bigint: ids, fencing tokens, counters.
BIGINT_MAX = 2**63 - 1


# knob name → check returning what the value must be, or None when it is valid.
KNOBS = {
    "reservation_max_horizon_s": _reservation_seconds,
    "reservation_max_hold_s": _reservation_seconds,
    "reservation_max_tolerance_s": _reservation_seconds,
    "drain_noncheckpointable": _drain_policy,
    # the data plane: the non-isolating local process runtime (default false), agent timings
    "allow_process_runtime": _boolean,
    "required_runtime": _required_runtime,  # jobs run under at least this runtime (default "")
    "startup_timeout_s": _agent_seconds,
    "stop_grace_s": _agent_seconds,
    "output_retention_days": _retention_days,
    # what a job may reach (jobs/networks.py): private ranges, the egress bound, the ports' bind
    "private_ranges_allowed": _boolean,
    "egress_allowed": _egress_allowed,
    "ingress_address": _ingress_address,
    "output_limit_mib": _output_limit,  # the default of a job's output_limit_mib
    # preemption (placement/preemption.py): fresh work is protected this long
    "preemption_min_runtime_s": _protection_seconds,
    "credit_rates": _credit_rates,
    # the queue's order and gate (placement/queue.py: the checks live with the defaults)
    **QUEUE_KNOBS,
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
