"""The whole stack for the end-to-end tests, once per module (per xdist worker):

- the control plane served over real HTTP by Django's live-server thread (WSGI, threaded),
  against the test database;
- one REAL worker agent, `python -m worker_agent …` in a subprocess, enrolled with an enrollment
  token into a pool of its own and running jobs on the real Docker engine, pulling the busybox
  test image from the loopback registry;
- the scheduling pass and the sweeps are the real Celery task functions, called in the test's
  process when a test needs them (`Stack.drive`). A Celery worker subprocess would also work,
  but it would poll on its own clock (beat: every 2 s) and would sweep with the real `now`,
  while these tests sweep with a `now` in the future instead of waiting minutes.

pytest-django's `live_server` flushes the database after every test, which would end the
agent's node and credential each time; so the database is unblocked for the whole module here
(each test leaves its jobs ended) and flushed once at the end. Heartbeats every second (the
pool's `heartbeat_interval_s`), a 1 s stop grace, polls every 0.3 s: the module runs in about
25 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import pytest
import requests
from channels.testing.live import make_application, set_database_connection
from daphne.testing import DaphneProcess
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.testcases import LiveServerThread, _StaticFilesHandler

from config.builders import (
    LOCAL_REGISTRY,
    build_person,
    build_pool,
    build_tenant,
    build_token,
)
from nodes import services as node_services
from nodes.models import Node
from pools.actors import Actor
from pools.models import Quota
from pools.services import policy_version_publish
from scheduling import tasks as scheduling_tasks
from tests.conftest import require_service
from worker_agent.runtime import disks
from worker_agent.state import write_private

ROOT = Path(__file__).resolve().parents[2]
ACTOR = Actor.system("e2e")


def _docker():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except DockerException as exc:
        require_service(False, f"the Docker engine ({exc}); run .ci/ensure-services.sh")
    return client


class Agent:
    """The agent subprocess: started, SIGKILLed, restarted with the same state dir."""

    def __init__(self, api: str, state_dir: Path, node_name: str, token: str):
        self.api, self.state_dir, self.node_name, self.token = api, state_dir, node_name, token
        self.log = state_dir.parent / f"{node_name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "worker_agent", "--api", self.api]
        command += ["--state-dir", str(self.state_dir), "--runtime", "docker"]
        command += ["--node-name", self.node_name, "--address", "127.0.0.1", "--poll-s", "0.3"]
        if not (self.state_dir / "credential").exists():
            # by file, never on the command line (the process list shows it to every user)
            token_file = self.state_dir.parent / f"{self.node_name}.enroll-token"
            write_private(token_file, self.token.encode())
            command += ["--enroll-token-file", str(token_file)]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, its containers keep running."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return ""


class Stack:
    def __init__(self, *, url, pool, tenant, token, agent, docker_client):
        self.url, self.pool, self.tenant = url, pool, tenant
        self.agent, self.docker = agent, docker_client
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    # -- the tenant's API, over HTTP
    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.http.request(
            method, f"{self.url}/api/v1/{path.lstrip('/')}", timeout=30, **kwargs
        )

    def submit(self, name: str, command: list[str], **fields) -> requests.Response:
        body = {
            "tenant": self.tenant.slug,
            "pool": self.pool.slug,
            "name": name,
            "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
            "image": "127.0.0.1:5000/computepool/busybox:test",
            "command": command,
        } | fields
        return self.api("POST", "jobs", json=body)

    def job(self, job_id: int) -> dict:
        response = self.api("GET", f"jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def reasons(self, job_id: int) -> list[str]:
        return [e["reason"] for e in self.api("GET", f"jobs/{job_id}/events").json()]

    # -- the control loop
    def drive(self, job_id: int, until, timeout: float = 30) -> dict:
        """Run the scheduling pass (the real Celery task function) until the job, as the API
        shows it, satisfies `until` (a state name or a predicate)."""
        check = (lambda job: job["state"] == until) if isinstance(until, str) else until
        deadline = time.monotonic() + timeout
        while True:
            scheduling_tasks.scheduling_pass()
            job = self.job(job_id)
            if check(job):
                return job
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} is {job['state']} after {timeout}s (events: "
                    f"{self.reasons(job_id)}); agent log:\n{self.agent.tail()}"
                )
            time.sleep(0.2)

    # -- the node and its containers
    def node(self) -> Node:
        return Node.objects.get(pool=self.pool, name=self.agent.node_name)

    def containers(self, job_id: int | None = None) -> list:
        labels = [f"computepool.node={self.agent.node_name}"]
        if job_id is not None:
            labels.append(f"computepool.job={job_id}")
        # sparse: the list as the engine gives it, without inspecting each container after (the
        # agent may remove one in between, and the inspect would fail with 404)
        return self.docker.containers.list(all=True, sparse=True, filters={"label": labels})

    def wait_ready(self, timeout: float = 30) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = Node.objects.filter(pool=self.pool, name=self.agent.node_name).first()
            if node is not None and node.state == "ready" and node.reachability == "reachable":
                return node
            if not self.agent.alive():
                break
            time.sleep(0.2)
        pytest.fail(f"the agent's node is not ready; agent log:\n{self.agent.tail()}")

    def ensure_agent(self) -> None:
        """A test that killed the agent for good restarts it; the next one finds it up."""
        if not self.agent.alive():
            self.agent.start()
        self.wait_ready()


@pytest.fixture(scope="module")
def e2e_database(django_db_setup, django_db_blocker):
    """pytest-django creates the test database only when a collected test asks for `db` (or
    is marked django_db); these tests use neither (see above), so when only they run, the test
    database is created here."""
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():
        yield
        return
    with django_db_blocker.unblock():
        created = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(created, verbosity=0)


@pytest.fixture(scope="module")
def stack(e2e_database, django_db_blocker, tmp_path_factory):
    docker_client = _docker()
    tmp = tmp_path_factory.mktemp("e2e")
    media = override_settings(MEDIA_ROOT=str(tmp / "media"))
    media.enable()
    server = None
    agent = None
    try:
        with django_db_blocker.unblock():
            pool = build_pool("e2e", name="End to end", exact_capacity=True, heartbeat_interval_s=1)
            # A short stop grace and startup timeout, from the pool's policy (agent knobs).
            current = pool.scheduling_policy.current
            policy_version_publish(
                policy=pool.scheduling_policy,
                weights=dict(current.weights),
                knobs=dict(current.knobs or {}) | {"stop_grace_s": 1, "startup_timeout_s": 60},
                actor=ACTOR,
            )
            assert LOCAL_REGISTRY in pool.registries.values_list("prefix", flat=True)
            tenant = build_tenant("e2e-vision", name="E2E vision")
            Quota.objects.create(tenant=tenant, pool=pool, cpu_millicores=64000, memory_mib=65536)
            person = build_person("e2e-alice", tenant=tenant)
            token = build_token(person)
            _, enroll_token = node_services.enrollment_token_issue(pool=pool, actor=ACTOR)
            server = LiveServerThread("127.0.0.1", _StaticFilesHandler)
            server.daemon = True
            server.start()
            server.is_ready.wait()
            if server.error:
                raise server.error
            url = f"http://127.0.0.1:{server.port}"
            name = f"e2e-{uuid.uuid4().hex[:8]}"  # containers are found by node name
            agent = Agent(url, tmp / "agent", name, enroll_token)
            built = Stack(
                url=url,
                pool=pool,
                tenant=tenant,
                token=token,
                agent=agent,
                docker_client=docker_client,
            )
            agent.start()
            built.wait_ready()
            yield built
    finally:
        if agent is not None:
            agent.stop()
            for container in docker_client.containers.list(
                all=True, filters={"label": f"computepool.node={agent.node_name}"}
            ):
                container.remove(force=True)
            disks.release(tmp)  # the jobs' filesystems an agent that stopped left mounted
        if server is not None:
            server.terminate()
        media.disable()
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)
        docker_client.close()


@pytest.fixture(autouse=True)
def _database(django_db_blocker, stack):
    """Tests read and sweep the same database the live server writes (no rollback)."""
    with django_db_blocker.unblock():
        stack.ensure_agent()
        yield


# --- the console in a browser (tests/e2e/test_console.py, test_operator_console.py) -----------

ARTIFACTS = ROOT / "test-artifacts"


def _fresh_child_after_fork() -> None:
    """Runs first in daphne's forked child. asgiref's sync_to_async executor is one thread
    held at class level: once this process has used it (any async test before this module), the
    fork inherits an executor whose thread does not exist there, and every `database_sync_to_async`
    in the consumers waits forever (the socket never opens). A fresh executor, fresh channel
    layers (their Redis pools belong to the parent's loops), then the test database."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from channels.layers import channel_layers

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    channel_layers.backends.clear()
    set_database_connection()


@pytest.fixture(scope="module")
def console(stack, django_db_blocker):
    """The console's URL: daphne serving config.asgi's routes (HTTP, static, websockets) in its
    own process, beside the stack's WSGI server the agent talks to; both use the test database
    and the same Redis channel layer, so what the agent reports reaches the browser's socket."""
    with django_db_blocker.unblock():
        connections.close_all()  # the forked server must not share this process's connection
    server = DaphneProcess(
        "127.0.0.1",
        partial(make_application, static_wrapper=ASGIStaticFilesHandler),
        setup=_fresh_child_after_fork,
    )
    server.start()
    if not server.ready.wait(30):
        pytest.fail("daphne did not start")
    yield f"http://127.0.0.1:{server.port.value}"
    server.terminate()
    server.join(10)
    if server.is_alive():  # a forked daphne can miss its SIGTERM; the module must not hang on it
        server.kill()
        server.join(10)


def screenshot(page, name: str) -> None:
    """A main page's screenshot under test-artifacts/ (gitignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
