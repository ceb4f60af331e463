"""The settings work on SQLite (make run) and PostgreSQL (tests, production)."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from config import tasks

ROOT = Path(__file__).resolve().parents[2]


def test_suite_runs_on_postgresql(db):
    assert connection.vendor == "postgresql"


SQLITE_PRODUCT_CHECK = """
import django; django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("load_demo", verbosity=0)
from django.db import connection
from jobs.services import job_submit
from pools.actors import Actor
from pools.models import ComputePool, ResourceShape, Tenant
from scheduling.passes import scheduling_pass
from leases.selectors import ledger_problems
pool, tenant = ComputePool.objects.get(slug="lab"), Tenant.objects.get(slug="vision")
# The demo's example nodes have no agent and stay registered: made ready here, as their agents'
# first heartbeats would.
from nodes import services as node_services
for node in pool.nodes.all():
    node = node_services.node_verify(node=node, actor=Actor.system("t"))
    node_services.node_mark_ready(node=node, actor=Actor.system("t"))
from config.builders import pinned_test_image
image = pinned_test_image()
for shape in ("cpu-small", "gpu-a100-1", "gpu-mig-1g", "gpu-share-quarter"):
    job_submit(tenant=tenant, pool=pool, name=shape, image=image, actor=Actor.system("t"),
               shape=ResourceShape.objects.get(pool=pool, name=shape))
result = scheduling_pass()
print(connection.vendor, len(result.placed), ledger_problems(pool))
"""


def test_sqlite_default_runs_the_product_path(tmp_path):
    """`make run` uses SQLite: migrate, demo, submit, and the scheduling pass place jobs."""
    env = os.environ | {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "REGISTRY_INSECURE_HOSTS": "127.0.0.1:5000",  # what runstack sets
    }
    out = subprocess.run(
        [sys.executable, "-c", SQLITE_PRODUCT_CHECK],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.stdout.strip().splitlines()[-1] == "sqlite 4 []"
    assert (tmp_path / "db.sqlite3").stat().st_size > 0


def test_migrations_are_complete(db):
    # Raises SystemExit(1) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _with_settings(script: str, **env) -> str:
    """What `script` prints in a fresh process under config.settings and `env`."""
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "config.settings"} | env
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_postgresql_connection_pool_is_configurable():
    script = (
        "import django; django.setup();"
        "from django.db import connection;"
        "connection.ensure_connection();"
        "pool = connection.settings_dict['OPTIONS']['pool'];"
        "print(pool['max_size'], connection.pool is not None)"
    )
    out = _with_settings(
        script,
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
        DATABASE_POOL_MAX_SIZE="8",
    )
    assert out.split() == ["8", "True"]


def _channel_prefix(**env) -> str:
    script = (
        "from django.conf import settings;"
        "print(settings.CHANNEL_LAYERS['default']['CONFIG']['prefix'])"
    )
    return _with_settings(script, **({"CHANNEL_LAYER_PREFIX": "", "DEPLOYMENT_PREFIX": ""} | env))


def test_two_deployments_on_one_redis_never_share_live_events():
    """The channel prefix follows the database: one deployment's processes agree on it, two
    deployments (two make runs, staging beside production) on one Redis never do."""
    first = _channel_prefix(DATABASE_URL="postgres://postgres@127.0.0.1:5432/first")
    assert first == _channel_prefix(DATABASE_URL="postgres://postgres@127.0.0.1:5432/first")
    assert first != _channel_prefix(DATABASE_URL="postgres://postgres@127.0.0.1:5432/second")
    assert first != _channel_prefix(DATABASE_URL="sqlite:////tmp/first")
    assert _channel_prefix(DATABASE_URL="sqlite:////tmp/x", CHANNEL_LAYER_PREFIX="mine") == "mine"
    assert _channel_prefix(DATABASE_URL="sqlite:////tmp/x", DEPLOYMENT_PREFIX="ours") == "ours"


@pytest.mark.slow
def test_two_deployments_on_one_redis_never_take_each_others_tasks(db, tmp_path):
    """A real worker of deployment A; a task sent by deployment B (another prefix, the same Redis
    database) never reaches it, A's own does (health_beat writes A's heartbeat)."""
    ours, theirs = (f"test-{name}-{uuid.uuid4().hex[:8]}" for name in ("a", "b"))
    client = tasks.redis_client()
    heartbeat = f"computepool:health:beat:{ours}"
    db_settings = connection.settings_dict
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db_settings['USER']}@{db_settings['HOST']}:"
        f"{db_settings['PORT']}/{db_settings['NAME']}",
        "DEPLOYMENT_PREFIX": ours,
        "LOG_FORMAT": "json",
    }
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--concurrency", "1"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{ours}@t"]
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    try:

        def send(prefix: str) -> None:
            # not the current app: shared tasks of later tests would be sent through it
            sender = Celery(broker=settings.REDIS_URL, set_as_current=False)
            sender.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
            sender.send_task("config.health_beat")

        def ran(timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if client.get(heartbeat) is not None:
                    return True
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                time.sleep(0.2)
            return False

        send(theirs)
        assert not ran(timeout=5)
        send(ours)
        assert ran(timeout=30), (tmp_path / "worker.log").read_text()[-3000:]
        # the worker is up and took A's: B's is still waiting for B's own workers
        assert client.llen(f"{theirs}:celery") == 1
    finally:
        worker.terminate()
        worker.wait(30)
        client.delete(heartbeat, f"{theirs}:celery")


def test_no_registry_is_reached_over_plain_http_by_default(monkeypatch, settings):
    """The loopback test registry is the tests' and `make run`'s (runstack), not production's."""
    monkeypatch.delenv("REGISTRY_INSECURE_HOSTS", raising=False)
    script = "from django.conf import settings; print(settings.REGISTRY_INSECURE_HOSTS)"
    assert _with_settings(script) == "[]"
    assert _with_settings(script, REGISTRY_INSECURE_HOSTS="a:5000,b:5000") == "['a:5000', 'b:5000']"
    assert settings.REGISTRY_INSECURE_HOSTS == ["127.0.0.1:5000", "localhost:5000"]  # the tests'
