"""`make run`: the whole product in one terminal — ASGI server (hypercorn, config/hypercorn.py),
Celery worker with beat, and one
local worker agent, so submitted jobs really run. Their command lines are config/roles.py's, the
same a fleet's processes run (docs/deployment.md), except that beat runs inside the worker.

With no Redis answering at REDIS_URL it serves an embedded Redis-protocol server (fakeredis)
on a free loopback port, so the broker and the channel layer work with nothing installed.
The agent (`python -m worker_agent`) uses the Docker engine when one answers and joins the demo
pool `lab`; otherwise the local process runtime, which does not isolate, in the demo's
development pool `dev` (the only one whose policy allows it). Its state is per node, in
var/agent/<control-plane id>/<node name>/: a second `make run` on this machine (another
database, so another control-plane id; or the same one while the first agent holds its dir)
gets a node and a state dir of its own and never touches the first one's credential. On its
first start it enrolls with a fresh enrollment token, passed in its environment (never on its
command line); afterwards its stored credential is enough.
Ctrl-C stops everything it started (the agent leaves running containers to its next start).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config import roles
from config.builders import TEST_IMAGE_TAG, build_token
from config.demo import DEV_POOL, POOL, agent_enrollment_token
from nodes.choices import NodeState
from nodes.models import Node
from nodes.selectors import control_plane_id
from worker_agent.state import AgentState

REGISTRY = "127.0.0.1:5000"
DEMO_USER = "alice"  # a member of tenant vision: her API token is written for curl


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_embedded_redis() -> str:
    """A Redis-protocol server in a thread of this process; children reach it over TCP."""
    from fakeredis import TcpFakeServer

    port = _free_port()
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    threading.Thread(target=server.serve_forever, daemon=True, name="embedded-redis").start()
    return f"redis://127.0.0.1:{port}/0"


def stack_environment(redis_url: str, metrics_dir: Path) -> dict:
    """The server's and the worker's environment: this one, with the loopback registry reached
    over plain http unless REGISTRY_INSECURE_HOSTS is set (the production default: none), and
    the processes' own metrics in `metrics_dir` (emptied here), where /metrics reads them all
    (prometheus-client's multiprocess mode, docs/observability.md). A volume export runs the
    test image of that registry unless VOLUME_EXPORT_IMAGE is set (the demo's pools allow it)."""
    loopback = {
        "REGISTRY_INSECURE_HOSTS": ",".join(settings.LOOPBACK_REGISTRY_HOSTS),
        "VOLUME_EXPORT_IMAGE": TEST_IMAGE_TAG,
    }
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    own = {"REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    return loopback | os.environ | own | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}


def web_command(host: str, port: int) -> list[str]:
    """The ASGI server (config/roles.py's web role) on host:port."""
    return roles.web_command(roles.bind_address(host, port))


def worker_command(schedule: Path) -> list[str]:
    """One Celery worker with beat embedded (the scheduling pass and the sweeps), beat keeping
    its schedule's state in the file `schedule`: a fleet runs them as separate roles."""
    return roles.worker_command(concurrency=2, embedded_beat=schedule)


def stop_processes(processes) -> None:
    """SIGTERM to each that still runs, then up to 10 s each to exit before SIGKILL."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no permission: all mean "no engine here"
        return False


def registry_answers(image_tag: str = TEST_IMAGE_TAG) -> tuple[bool, bool]:
    """(the loopback registry answers, the busybox test image is in it)."""
    repository, _, tag = image_tag.removeprefix(REGISTRY + "/").rpartition(":")
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=2):
            pass
    except urllib.error.HTTPError:
        pass  # 401 still means a registry answers
    except OSError:
        return False, False
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repository}/manifests/{tag}",
        method="HEAD",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.oci.image.index.v1+json"
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=2):
            return True, True
    except OSError:
        return True, False


# What the agent's process inherits of runstack's environment: the node's own view of the world,
# never the control plane's secrets (SECRET_KEY, DATABASE_URL, ENCRYPTION_KEYS …): an agent is a
# node like any other, and on a real node none of them exist.
AGENT_ENV_NAMES = {"PATH", "HOME", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV", "PYTHONUNBUFFERED"}
AGENT_ENV_PREFIXES = ("LC_", "WORKER_AGENT_", "DOCKER_")


def agent_environment(env: dict) -> dict:
    return {
        name: value
        for name, value in env.items()
        if name in AGENT_ENV_NAMES
        or name.startswith(AGENT_ENV_PREFIXES)
        or name.lower().endswith("_proxy")
    }


def wait_for_http(url: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answers, healthy or not
        except OSError:
            time.sleep(0.3)
    return False


def agent_root() -> Path:
    """Where the state dirs of this control plane's local agents live, one per node."""
    return settings.BASE_DIR / "var" / "agent" / control_plane_id()


@dataclass
class AgentPlan:
    command: list
    env: dict  # added to the agent's environment: the enrollment token, when it enrolls
    state_dir: Path
    said: str  # what to print about it


def agent_command(*, api: str, pool: str, runtime: str, root: Path) -> AgentPlan:
    """The agent's command line (config/roles.py's agent role) and state dir under `root`
    (agent_root()). A state dir there of a node of this database in `pool` that no agent holds
    now resumes that node; otherwise a new node with a state dir of its own joins `pool` with a
    fresh single-use enrollment token. An existing state dir is never removed or reused for
    another node."""
    # the Docker runtime has no pause image of its own: the test image `make services` pushes
    pause_image = os.environ.get("WORKER_AGENT_PAUSE_IMAGE") or TEST_IMAGE_TAG

    def command(state_dir: Path, node_name=None) -> list[str]:
        return roles.agent_command(
            api,
            state_dir,
            pool=pool,
            runtime=runtime,
            address="127.0.0.1",
            pause_image=pause_image,
            node_name=node_name,
        )

    for state_dir in sorted(root.iterdir()) if root.is_dir() else ():
        if (
            (state_dir / "credential").exists()
            and _enrolled_here(state_dir, pool)
            and not AgentState.in_use(state_dir)
        ):
            return AgentPlan(command(state_dir), {}, state_dir, "resumes its enrolled node")
    # The agent's default node name (the hostname) may already exist from an earlier state
    # dir: a new name then, since node names are unique in a pool and state dirs per node.
    base = f"local-{socket.gethostname()}"[:80]
    name, n = base, 1
    while Node.objects.filter(pool__slug=pool, name=name).exists() or _taken(root / name):
        n += 1
        name = f"{base}-{n}"
    state_dir = root / name
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {"WORKER_AGENT_ENROLL_TOKEN": agent_enrollment_token(pool)}
    return AgentPlan(command(state_dir, name), env, state_dir, f"enrolls as {name}")


def _taken(state_dir: Path) -> bool:
    """A state dir holding a credential (of any database) or used by an agent now."""
    return (state_dir / "credential").exists() or AgentState.in_use(state_dir)


def _state_node(state_dir: Path):
    """The node the agent's state dir says it is, if this database has it."""
    try:
        node_id = json.loads((state_dir / "agent.json").read_text()).get("node_id")
    except (OSError, ValueError):
        return None
    return Node.objects.filter(pk=node_id).select_related("pool").first() if node_id else None


def _enrolled_here(state_dir: Path, pool: str) -> bool:
    node = _state_node(state_dir)
    return node is not None and node.pool.slug == pool and node.state != NodeState.RETIRED


def agent_node_status(state_dir: Path) -> str:
    """The agent's node as the control plane sees it ("" before it enrolled)."""
    node = _state_node(state_dir)
    if node is None:
        return ""
    runtime = node.agent_runtime or "no heartbeat yet"
    if node.agent_runtime and node.runtimes:  # gvisor among them where runsc is registered
        runtime += f" (offers {', '.join(node.runtimes)})"
    return (
        f"node {node.name} in pool {node.pool.slug}: {node.state}, {node.reachability}, {runtime}"
    )


def write_demo_token(path: Path) -> str:
    """A fresh API token of the demo's tenant member, in a 0600 file, for curl."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username=DEMO_USER)
    secret = build_token(user, name="make run")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


class Command(BaseCommand):
    help = "Run the ASGI server and a Celery worker with beat; Ctrl-C stops all."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--no-agent", action="store_true", help="do not start the local worker agent"
        )

    def handle(self, *args, host, port, no_agent=False, **options):
        try:  # beat runs inside the worker: a bad value would end it while the rest ran on
            roles.beat_lock_timeout()
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        redis_url = settings.REDIS_URL
        redis_mode = f"external Redis at {redis_url}"
        if not _redis_answers(redis_url):
            redis_url = start_embedded_redis()
            redis_mode = f"embedded Redis-protocol server at {redis_url} (no Redis at REDIS_URL)"
        env = stack_environment(redis_url, settings.BASE_DIR / "var" / "metrics")
        commands = {
            "web": web_command(host, port),
            "worker+beat": worker_command(settings.BASE_DIR / "var" / "beat-schedule"),
        }
        database = settings.DATABASES["default"]
        self.stdout.write(self.style.SUCCESS("Compute Pool is starting:"))
        self.stdout.write(f"  console and API  http://{host}:{port}/   (API docs: /api/docs/)")
        self.stdout.write(f"  health           http://{host}:{port}/healthz")
        self.stdout.write(
            f"  database         {database['ENGINE'].rsplit('.', 1)[-1]}: {database['NAME']}"
        )
        self.stdout.write(f"  broker, channels {redis_mode}")
        self.stdout.write("  celery           worker with beat (scheduling sweeps)")
        agent = None if no_agent else self.plan_agent(host, port)
        agent_dir = agent.state_dir if agent else None
        token_file = settings.BASE_DIR / "var" / "demo-token"
        write_demo_token(token_file)
        self.stdout.write(
            f"  API token        of {DEMO_USER} (tenant vision) in var/demo-token: "
            "TOKEN=$(cat var/demo-token)"
        )
        self.stdout.write("Ctrl-C stops all of it.")
        processes = {name: subprocess.Popen(cmd, env=env) for name, cmd in commands.items()}
        if agent is not None:
            # The agent enrolls over HTTP: start it once the server answers.
            if wait_for_http(f"http://{host}:{port}/healthz"):
                agent_env = agent_environment(env) | agent.env
                processes["agent"] = subprocess.Popen(agent.command, env=agent_env)
                self.stdout.write(f"agent started (pid {processes['agent'].pid})")
            else:
                self.stderr.write("the server did not answer within 30 s: agent not started")
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        agent_said, next_look = "", 0.0
        try:
            while not stopping:
                for name, process in list(processes.items()):
                    if process.poll() is None:
                        continue
                    if name == "agent":  # the product still serves; jobs wait for a node
                        self.stderr.write(
                            f"agent exited with {process.returncode}; the server keeps running "
                            "but no job will run (see the agent's log above)"
                        )
                        del processes[name]
                        continue
                    self.stderr.write(f"{name} exited with {process.returncode}; stopping.")
                    stopping = True
                if agent_dir is not None and time.monotonic() >= next_look:
                    # Print the agent's node whenever its state changes (enrolled, ready …).
                    next_look = time.monotonic() + 5
                    said = agent_node_status(agent_dir)
                    if said and said != agent_said:
                        self.stdout.write(self.style.SUCCESS(f"agent: {said}"))
                        agent_said = said
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            stop_processes(processes.values())
            self.stdout.write("Stopped.")

    def plan_agent(self, host: str, port: int) -> AgentPlan:
        """Print what the local agent will be; its command line and state dir."""
        registry, test_image = registry_answers()
        if docker_answers():
            pool, runtime = POOL["slug"], "docker"
            where = "Docker engine (containers isolate each job)"
        else:
            pool, runtime = DEV_POOL["slug"], "process"
            where = (
                "local process runtime — NOT isolating, no Docker engine answers; jobs write to "
                '"$OUTPUTS_DIR" (there is no /outputs)'
            )
        api = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        plan = agent_command(api=api, pool=pool, runtime=runtime, root=agent_root())
        self.stdout.write(f"  worker agent     pool {pool}, {where}")
        self.stdout.write(
            f"                   {plan.said}; state in "
            f"{plan.state_dir.relative_to(settings.BASE_DIR)}"
        )
        if not registry:
            self.stdout.write(
                f"  image registry   none answers at {REGISTRY}: every submit is refused "
                "image_invalid (run `make services`, or see README 'Run your first job')"
            )
        else:
            found = "with" if test_image else "WITHOUT"
            self.stdout.write(f"  image registry   {REGISTRY} ({found} {TEST_IMAGE_TAG})")
        return plan
