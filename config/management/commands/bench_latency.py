"""python manage.py bench_latency --rate R --jobs N [--timeout S] [--floor-runs K] [--json]

Submit to running, measured from outside (issue 20, goal 1). It starts the stack as `make run`
does (runstack's own commands: the ASGI server, a Celery worker with beat, one local worker
agent on the Docker engine in the demo pool `lab`), but on a throwaway PostgreSQL database
(created and migrated as bench_scheduler's, loaded with the demo, dropped at the end), on a free
port, with its agent's state dir, beat schedule, job outputs and logs in a temporary directory,
and on a Redis database of its own (an empty one of REDIS_URL's server, claimed with a key and
flushed at the end; an embedded Redis-protocol server when none answers), so it never touches a
running `make run`. Once the agent's node is ready and one warm-up job (not counted) has run,
it times the engine alone (scheduling/bench/latency.py `engine_floor`), then submits N tiny jobs
(`sh -c true`, 100m CPU, 64 MiB, the pinned test image, no network) through the public API with
the demo tenant member's token at an open-loop R per minute, waits for all to end, reads their
events and prints ONE JSON object. Every process it started is stopped and the database dropped
on the way out, also on Ctrl-C, SIGTERM or an error (the logs' tails go to stderr then).
Over SQLite it re-runs itself over DATABASE_URL, or postgres://postgres@127.0.0.1:5432/computepool.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import redis
import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from config.builders import TEST_IMAGE_TAG, build_token
from config.demo import POOL, load_demo
from config.management.commands.runstack import (
    DEMO_USER,
    _free_port,
    _redis_answers,
    agent_command,
    agent_environment,
    docker_answers,
    registry_answers,
    stack_environment,
    start_embedded_redis,
    stop_processes,
    wait_for_http,
    web_command,
    worker_command,
)
from jobs.models import Job
from nodes.choices import NodeState, Reachability
from nodes.models import Node
from nodes.selectors import control_plane_id
from scheduling.bench.latency import (
    engine_floor,
    job_body,
    job_latencies,
    submit_open_loop,
    submit_summary,
    wait_for_end,
)
from worker_agent.state import AgentState

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/computepool"
TENANT = "vision"  # the demo member's tenant (runstack's DEMO_USER)
CLAIM_KEY = "computepool:bench_latency:claim"


class Command(BaseCommand):
    help = "Submit-to-running latency of tiny jobs at an open-loop rate, on a throwaway stack."

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=float, default=120.0, help="submits per minute")
        parser.add_argument("--jobs", type=int, default=240, help="how many jobs")
        parser.add_argument(
            "--timeout",
            type=float,
            default=120.0,
            help="seconds after the last send for all to end",
        )
        parser.add_argument("--floor-runs", type=int, default=5, help="engine-floor runs")
        parser.add_argument("--json", action="store_true", help="one JSON object on stdout")

    def handle(self, *args, **opts):
        if connection.vendor != "postgresql":
            url = os.environ.get("DATABASE_URL") or ""
            env = {**os.environ, "DATABASE_URL": url if "postgres" in url else DEFAULT_URL}
            sys.exit(_rerun([sys.executable, *sys.argv], env))
        if opts["rate"] <= 0 or opts["jobs"] < 1:
            raise CommandError("--rate must be above 0 and --jobs at least 1")
        if not docker_answers():
            raise CommandError("no Docker engine answers: the benchmark runs jobs in containers")
        if registry_answers() != (True, True):
            raise CommandError(f"the loopback registry does not serve {TEST_IMAGE_TAG}")
        signal.signal(signal.SIGTERM, _interrupt)
        stack = Stack()
        database = settings.DATABASES["default"]
        original = database["NAME"]
        database.setdefault("TEST", {})["NAME"] = f"bench_latency_{stack.tag}"
        created = interrupted = False
        try:
            connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            created = True
            load_demo()
            result = stack.run(opts)
        except KeyboardInterrupt:
            interrupted = True
        except Exception:
            stack.say_logs(self.stderr)
            raise
        finally:
            # a second Ctrl-C (a terminal sends one to each process) must not cut the cleanup
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stack.stop()
            if created:
                _drop_database(original)
        if interrupted:
            raise CommandError(
                "interrupted: its stack stopped, its database dropped", returncode=130
            )
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            self.stdout.write(json.dumps(result, indent=2))


def _interrupt(*_):
    raise KeyboardInterrupt


def _rerun(command: list, env: dict) -> int:
    """This command again, over PostgreSQL; Ctrl-C and SIGTERM are passed on, never turned
    into a kill, so the run below stops its stack and drops its database."""
    child = subprocess.Popen(command, env=env)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _: child.send_signal(signum))
    return child.wait()


class Stack:
    """The throwaway stack: its directory, Redis database, processes; `stop` undoes it all."""

    def __init__(self):
        self.tag = secrets.token_hex(4)
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-latency-{self.tag}-"))
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.redis_url, self.redis_release = "", None
        self.control_plane = ""

    def run(self, opts) -> dict:
        started = time.monotonic()
        self.redis_url, self.redis_release = claim_redis_database(settings.REDIS_URL, self.tag)
        port = _free_port()
        api = f"http://127.0.0.1:{port}"
        env = stack_environment(self.redis_url, self.dir / "metrics") | {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": database_url(settings.DATABASES["default"]),
            "DEPLOYMENT_PREFIX": f"bench-latency-{self.tag}",
            "CELERY_BROKER_URL": "",  # REDIS_URL's, the database claimed
            "CELERY_RESULT_BACKEND": "",
            "MEDIA_ROOT": str(self.dir / "media"),
            "DEBUG": os.environ.get("DEBUG", "false"),
        }
        self.start("web", web_command("127.0.0.1", port), env)
        self.start("worker+beat", worker_command(self.dir / "beat-schedule"), env)
        if not wait_for_http(f"{api}/healthz", timeout=60):
            raise CommandError("the server did not answer within 60 s")
        self.control_plane = control_plane_id()
        agent = agent_command(api=api, pool=POOL["slug"], runtime="docker", root=self.dir / "agent")
        self.start("agent", agent.command, agent_environment(env) | agent.env)
        node = self.wait_for_node(agent.state_dir, timeout=90)
        from django.contrib.auth import get_user_model

        token = build_token(get_user_model().objects.get(username=DEMO_USER), name="bench")
        url = f"{api}/api/v1/jobs"
        image = self.warm_up(url, token)
        floor = engine_floor(image, runs=opts["floor_runs"])
        bodies = [
            job_body(TENANT, POOL["slug"], image, f"latency-{i}") for i in range(opts["jobs"])
        ]
        sent = submit_open_loop(url, token, bodies, opts["rate"])
        job_ids = [s.job_id for s in sent if s.job_id is not None]
        ended = wait_for_end(job_ids, opts["timeout"])
        latencies = job_latencies(job_ids)
        running_p50 = latencies["leased_to_running"]["p50"]
        floor_s = floor["docker_run_s"]["median"]
        return {
            "rate_per_min": opts["rate"],
            "jobs": opts["jobs"],
            "all_ended": ended,
            "submit": submit_summary(sent),
            **latencies,
            "engine_floor": floor,
            "leased_to_running_p50_over_floor": (
                round(running_p50 / floor_s, 2) if running_p50 is not None else None
            ),
            "stack": {
                "database": settings.DATABASES["default"]["NAME"],  # dropped at the end
                "redis": self.redis_url,  # a database of its own, flushed at the end
                "node": node.name,
                "node_cpu_millicores": node.cpu_millicores_allocatable,
                "agent_poll_s": float(os.environ.get("WORKER_AGENT_POLL_S", "2")),
                "scheduler_pass_period_s": settings.SCHEDULER_PASS_PERIOD_S,
                "debug": env["DEBUG"],
            },
            "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
            "commit": _commit(),
            "wall_s": round(time.monotonic() - started, 1),
        }

    def warm_up(self, url: str, token: str) -> str:
        """One job of the same kind, not counted: the chain works end to end and the image is
        on the node. Returns the image as its submit pinned it (to its digest)."""
        body = job_body(TENANT, POOL["slug"], TEST_IMAGE_TAG, "latency-warmup")
        answer = requests.post(
            url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        if answer.status_code != 201:
            raise CommandError(
                f"the warm-up submit was refused: {answer.status_code} {answer.text}"
            )
        job = answer.json()
        if not wait_for_end([job["id"]], 90):
            raise CommandError("the warm-up job did not end within 90 s")
        state = Job.objects.get(pk=job["id"]).state
        if state != "succeeded":
            raise CommandError(f"the warm-up job ended {state}")
        return job["image"]

    def start(self, name: str, command: list, env: dict) -> None:
        self.logs[name] = self.dir / f"{name}.log"
        with open(self.logs[name], "wb") as log:
            self.processes[name] = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def wait_for_node(self, state_dir: Path, timeout: float) -> Node:
        """The agent's node once it is ready, reachable and has sent a heartbeat."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise CommandError(f"{name} exited with {process.returncode}")
            node_id = AgentState(state_dir).info().get("node_id")
            node = Node.objects.filter(pk=node_id).first() if node_id else None
            if (
                node is not None
                and node.state == NodeState.READY
                and node.reachability == Reachability.REACHABLE
                and node.agent_runtime
            ):
                return node
            time.sleep(0.5)
        raise CommandError(f"the agent's node was not ready within {timeout:.0f} s")

    def stop(self) -> None:
        """The agent first (so nothing new starts), then the server and the worker; then any
        container of this control plane the agent left, the Redis database and the files."""
        agent = self.processes.pop("agent", None)
        stop_processes([agent] if agent else [])
        stop_processes(self.processes.values())
        if self.control_plane:
            _remove_containers(self.control_plane)
        if self.redis_release is not None:
            self.redis_release()
            self.redis_release = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def say_logs(self, stream, lines: int = 30) -> None:
        for name, path in self.logs.items():
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            stream.write(f"--- {name} (last {len(tail)} lines of its log)")
            stream.write("\n".join(tail))


def claim_redis_database(url: str, tag: str):
    """A Redis database of its own on REDIS_URL's server: the highest-numbered empty one
    (never 0), claimed with a key set only if absent; its release flushes it. With no Redis
    answering, an embedded Redis-protocol server (runstack's), gone with this process."""
    if not _redis_answers(url):
        return start_embedded_redis(), None
    parts = urllib.parse.urlsplit(url)
    for number in range(15, 0, -1):
        candidate = urllib.parse.urlunsplit(parts._replace(path=f"/{number}"))
        client = redis.Redis.from_url(candidate, socket_connect_timeout=2)
        try:
            if client.dbsize() or not client.set(CLAIM_KEY, tag, nx=True, ex=6 * 3600):
                continue
        except redis.ResponseError:  # fewer databases configured
            continue
        finally:
            client.close()

        def release(candidate=candidate):
            with redis.Redis.from_url(candidate, socket_connect_timeout=2) as claimed:
                if claimed.get(CLAIM_KEY) == tag.encode():
                    claimed.flushdb()

        return candidate, release
    raise CommandError(f"no empty Redis database (1–15) at {url} to claim")


def database_url(database: dict) -> str:
    """The django-environ URL of a PostgreSQL database of Django's settings."""
    quote = urllib.parse.quote
    user, password = quote(database.get("USER") or "", safe=""), database.get("PASSWORD")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else f"{user}@" if user else ""
    host = quote(database.get("HOST") or "", safe="")
    port = f":{database['PORT']}" if database.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{quote(database['NAME'], safe='')}"


def _drop_database(original: str) -> None:
    """Django's own drop; a connection somebody left (a process killed mid-query) is ended
    first by PostgreSQL's FORCE."""
    name = settings.DATABASES["default"]["NAME"]
    try:
        connection.creation.destroy_test_db(original, verbosity=0)
    except Exception:
        connection.close()
        settings.DATABASES["default"]["NAME"] = original
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _remove_containers(control_plane: str) -> None:
    """Containers the agent left (an interrupted run): only this control plane's."""
    import docker

    try:
        client = docker.from_env(timeout=30)
    except Exception:
        return
    try:
        owned = {"label": f"computepool.control_plane={control_plane}"}
        for container in client.containers.list(all=True, filters=owned):
            container.remove(force=True)
    except Exception:
        pass
    finally:
        client.close()


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=10
    ).stdout.strip()


def _commit() -> str:
    """The tree measured: HEAD's short hash, `+changes` when tracked files differ from it."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+changes" if dirty else "")
