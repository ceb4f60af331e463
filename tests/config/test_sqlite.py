"""Every periodic task of beat's schedule works on `make run`'s SQLite, while a pass writes.

The suite runs on PostgreSQL (config.settings_test), so this runs the product's own settings
(config.settings) on a throwaway SQLite file in a subprocess: migrate, the demo, queued jobs,
then beat's tasks in threads beside a thread of scheduling passes and one of submits, the way
`make run`'s worker runs them side by side. On the old code the forecast failed with
`unrecognized token: ":"` (PostgreSQL-only SQL) and sample_capacity with `database is locked`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the subprocess runs. Its last line, JSON: [errors, jobs placed, jobs queued, their
# forecasts written, runs of each task].
PERIODIC_TASKS_UNDER_LOAD = r"""
import json, logging, threading, time, traceback
from datetime import timedelta
import django; django.setup()
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

call_command("migrate", verbosity=0)
call_command("load_demo", verbosity=0)

from config.builders import cpu_request, pinned_test_image
from config.celery import app

app.loader.import_default_modules()  # the apps' tasks.py, as a worker loads them (and Celery's
# Django fixup sets logging up again: the handler below comes after it)
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from leases.services import lease_reserve
from nodes import services as node_services
from nodes.models import Node
from pools.actors import Actor
from pools.models import ComputePool, ResourceShape, Tenant
from scheduling.models import CapacitySample

errors = []


class Errors(logging.Handler):
    # the tasks log a failure of one pool or row and go on: a logged error is a failure here
    def emit(self, record):
        errors.append(self.format(record))


logging.getLogger().addHandler(Errors(logging.ERROR))
with connection.cursor() as cursor:  # config/settings.py's options for SQLite
    cursor.execute("PRAGMA journal_mode")
    if cursor.fetchone()[0] != "wal" or connection.transaction_mode != "IMMEDIATE":
        errors.append("SQLite is not in WAL mode with IMMEDIATE transactions")

actor = Actor.system("t")
pool, tenant = ComputePool.objects.get(slug="lab"), Tenant.objects.get(slug="vision")
for node in pool.nodes.all():  # the demo's nodes have no agent: made ready, as a heartbeat would
    node = node_services.node_verify(node=node, actor=actor)
    node_services.node_mark_ready(node=node, actor=actor)
image = pinned_test_image()
shapes = [ResourceShape.objects.get(pool=pool, name=n) for n in ("cpu-small", "gpu-a100-1")]


def submit(count, tag):
    for i in range(count):
        job_submit(tenant=tenant, pool=pool, name=f"{tag}-{i}", image=image, actor=actor,
                   shape=shapes[i % len(shapes)])


# rows the sweeps must act on: a lease past its expiry (taken before the jobs, whose event
# passes fill the tenant's quota at once), a drain whose deadline passes meanwhile
past = timezone.now() - timedelta(minutes=10)
lease = lease_reserve(pool=pool, tenant=tenant, request=cpu_request(), actor=actor,
                      duration=timedelta(minutes=1), now=past)
submit(60, "before")  # more than the demo's nodes hold: some stay queued
drained = pool.nodes.order_by("-pk").first()
node_services.node_drain(node=drained, actor=actor, deadline=timezone.now() + timedelta(seconds=1))
connection.close()

schedule = {entry["task"] for entry in app.conf.beat_schedule.values()}
schedule.discard("config.health_beat")  # Redis only, no database
schedule.discard("scheduling.pass")  # its own thread below
assert {"scheduling.forecast_refresh", "scheduling.sample_capacity"} <= schedule, schedule
runs = {name: 0 for name in schedule | {"scheduling.pass"}}
stop = threading.Event()


def loop(name, call, pause):
    try:
        while not stop.is_set():
            try:
                call()
                if name in runs:
                    runs[name] += 1
            except Exception:
                errors.append(f"{name}: {traceback.format_exc()}")
            time.sleep(pause)
    finally:
        connection.close()


def passes():
    from scheduling.passes import scheduling_pass
    scheduling_pass()


def submits():
    submit(2, f"during-{time.monotonic_ns()}")


threads = [threading.Thread(target=loop, args=("scheduling.pass", passes, 0.0))]
threads.append(threading.Thread(target=loop, args=("submit", submits, 0.05)))
for name in sorted(schedule):
    threads.append(threading.Thread(target=loop, args=(name, app.tasks[name], 0.05)))
for thread in threads:
    thread.start()
time.sleep(4)
stop.set()
for thread in threads:
    thread.join(60)
assert not any(thread.is_alive() for thread in threads), "a thread hangs"

# once more after the load, so the queue's forecast is of the queue as it is now
app.tasks["scheduling.forecast_refresh"]()
errors += [f"capacity sample: {e}" for e in CapacitySample.objects.exclude(error="")
           .values_list("error", flat=True)]
lease.refresh_from_db()
if lease.state == "reserved":
    errors.append(f"lease {lease.pk} past its expiry still reserved")
if Node.objects.get(pk=drained.pk).drain_enforced_at is None:
    errors.append(f"node {drained.name}'s drain deadline passed, not enforced")
queued = Job.objects.filter(state=JobState.QUEUED)
placed = Job.objects.exclude(state=JobState.QUEUED).count()
print(json.dumps([errors, placed, queued.count(), queued.exclude(forecast={}).count(), runs]))
"""


@pytest.mark.slow
def test_every_periodic_task_runs_on_sqlite_beside_the_pass(tmp_path):
    env = os.environ | {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "REGISTRY_INSECURE_HOSTS": "127.0.0.1:5000",  # what runstack sets
        # a throwaway key ring, as config/settings_test.py's; tasks run in the process (eager),
        # never sent to a broker
        "ENCRYPTION_KEYS": "test-1=dGVzdC1rZXktb25lLXRlc3Qta2V5LW9uZS10ZXN0LWs=",
        "ENCRYPTION_KEYS_FILE": str(tmp_path / "no-keys"),
        "CELERY_TASK_ALWAYS_EAGER": "true",
    }
    out = subprocess.run(
        [sys.executable, "-c", PERIODIC_TASKS_UNDER_LOAD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: under a loaded suite its migrations alone take a minute
    )
    assert out.returncode == 0, out.stderr[-4000:]
    errors, placed, queued, forecast, runs = json.loads(out.stdout.strip().splitlines()[-1])
    assert errors == [], "\n".join(errors)[-4000:]
    assert placed > 0  # the passes wrote: jobs left the queue
    assert queued > 0 and forecast == queued  # every queued job got its forecast written
    assert all(runs.values()), runs  # every task ran at least once
