"""The product's processes, one role each (docs/deployment.md): `web` (the ASGI server), `worker`
(a Celery worker: the scheduling passes and the sweeps), `beat` (Celery beat alone: the periodic
tasks) and `agent` (the worker agent, on every node).

The command lines are built here and nowhere else: `manage.py role` execs them (deploy/'s
systemd units and Procfile), `make run` (runstack) starts them as children, and so does the
drill. `REQUIRED_SETTINGS` is what each role refuses to start without.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from environ import Env

# The settings each role needs set in its environment: their built-in defaults (SQLite under the
# checkout, a Redis on localhost, a development secret, a key ring file under var/) only suit
# `make run` on one machine. Why each: docs/deployment.md, "Settings per role".
REQUIRED_SETTINGS: dict[str, tuple[str, ...]] = {
    "web": (
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "DATABASE_URL",
        "REDIS_URL",
        "ENCRYPTION_KEYS",
        "MEDIA_ROOT",
    ),
    "worker": ("DATABASE_URL", "REDIS_URL", "ENCRYPTION_KEYS", "MEDIA_ROOT"),
    # the database names the deployment, and so beat's leader lock (config/celery.py)
    "beat": ("DATABASE_URL", "REDIS_URL"),
    # the agent checks its own (worker_agent/cli.py): a flag or its variable
    "agent": ("WORKER_AGENT_API", "WORKER_AGENT_STATE_DIR"),
}

# A required setting also counts as set when its alternative is: the key ring may come from a
# file, and outputs need no MEDIA_ROOT when they go to the object store.
ALTERNATIVES = {
    "ENCRYPTION_KEYS": "ENCRYPTION_KEYS_FILE",
    "MEDIA_ROOT": "OUTPUTS_TO_OBJECT_STORE",
}
TRUE = set(Env.BOOLEAN_TRUE_STRINGS)  # as the settings read OUTPUTS_TO_OBJECT_STORE
MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
# beat's last run times when no --schedule is given (runstack keeps its own there too)
DEFAULT_BEAT_SCHEDULE = Path(__file__).resolve().parent.parent / "var" / "beat-schedule"


def missing_settings(role: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The settings `role` needs that `environ` leaves unset or empty, as the error names them."""

    def is_set(name: str) -> bool:
        value = environ.get(name, "").strip()
        return value.lower() in TRUE if name == "OUTPUTS_TO_OBJECT_STORE" else bool(value)

    missing = []
    for name in REQUIRED_SETTINGS[role]:
        alternative = ALTERNATIVES.get(name)
        if is_set(name) or (alternative and is_set(alternative)):
            continue
        if alternative == "OUTPUTS_TO_OBJECT_STORE":
            alternative += "=true"
        missing.append(f"{name} (or {alternative})" if alternative else name)
    return missing


def unusable_settings(role: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """What is set but cannot work, checked before the server starts (a server that then fails
    on its own would be restarted by its supervisor, again and again)."""
    wrong = []
    keys_file = environ.get("ENCRYPTION_KEYS_FILE", "").strip()
    read = "ENCRYPTION_KEYS" in REQUIRED_SETTINGS[role] and keys_file
    read = read and not environ.get("ENCRYPTION_KEYS", "").strip()  # the variable comes first
    if read and not (os.path.isfile(keys_file) and os.access(keys_file, os.R_OK)):
        wrong.append(f"ENCRYPTION_KEYS_FILE={keys_file}: not a readable file")
    if role == "beat":
        try:
            beat_lock_timeout(environ)
        except ValueError as exc:
            wrong.append(str(exc))
    return wrong


def beat_lock_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """BEAT_LOCK_TIMEOUT_S (default 30): how long a dead holder keeps the others waiting."""
    raw = environ.get("BEAT_LOCK_TIMEOUT_S", "").strip() or "30"
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 3 <= value <= 3600:
        raise ValueError(f"BEAT_LOCK_TIMEOUT_S={raw!r}: expected seconds between 3 and 3600")
    return value


def role_command(role: str, *args: str) -> list[str]:
    """`manage.py role ROLE ARGS…`, as a supervisor runs it (deploy/): it checks the role's
    settings, then execs the server command built below in its own place."""
    return [sys.executable, str(MANAGE), "role", role, *args]


def bind_address(host: str, port: int) -> str:
    """hypercorn's --bind: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def web_command(bind: str, certfile=None, keyfile=None) -> list[str]:
    """The ASGI server (HTTP and websockets) with config/hypercorn.py's timeouts; TLS when a
    certificate and its key are given."""
    command = [sys.executable, "-m", "hypercorn", "--config", "python:config.hypercorn"]
    command += ["--bind", bind]
    if certfile and keyfile:
        command += ["--certfile", str(certfile), "--keyfile", str(keyfile)]
    return [*command, "config.asgi:application"]


def worker_command(concurrency: int = 2, hostname=None, *, embedded_beat: Path | None = None):
    """A Celery worker. `embedded_beat` (only `make run`): beat runs inside it too, keeping its
    schedule's state in that file; a fleet runs beat as its own role instead."""
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "info"]
    command += ["--concurrency", str(concurrency)]
    if hostname:
        command += ["--hostname", hostname]
    if embedded_beat is not None:
        command += ["--beat", "--schedule", str(embedded_beat)]
    return command


def beat_command(schedule=None) -> list[str]:
    """Celery beat alone, with the leader lock's scheduler (config/celery.py); `schedule` is
    the file of its last run times (default: var/beat-schedule under the checkout)."""
    schedule = schedule or DEFAULT_BEAT_SCHEDULE
    command = [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "info"]
    return [*command, "--schedule", str(schedule)]


def agent_command(
    api: str,
    state_dir,
    *,
    ca_file=None,
    pool=None,
    node_name=None,
    address=None,
    runtime: str = "docker",
    pause_image=None,
) -> list[str]:
    """The worker agent of one node. Its enrollment token goes in its environment
    (WORKER_AGENT_ENROLL_TOKEN), never on its command line."""
    command = [sys.executable, "-m", "worker_agent", "--api", api, "--state-dir", str(state_dir)]
    command += ["--runtime", runtime]
    for flag, value in (
        ("--ca-file", ca_file),
        ("--pool", pool),
        ("--node-name", node_name),
        ("--address", address),
        ("--pause-image", pause_image),
    ):
        if value:
            command += [flag, str(value)]
    return command
