"""Placement on events with a real Celery worker (`celery -A config worker`, 4 processes, on the
test database and a queue of its own): submits, racing triggers and beat's pass never
double-place a job nor overcommit a node; two workers never pass one pool at once; a burst of
1,000 submits within 5 s makes at most 20 passes of its pool, and every job is placed.

The worker is started once per module (~5 s); nothing here runs beat, so every pass is one an
event, or the test, asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection

from config.builders import (
    SYSTEM,
    build_node,
    build_pool,
    build_tenant,
    cpu_request,
    submit_job,
    submit_jobs,
)
from config.celery import app as celery_app
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import ledger_problems, overcommitted_nodes
from leases.services import lease_release
from pools.reasons import Reason
from scheduling import coalesce, tasks
from scheduling.models import PassRecord
from tests.conftest import require_service

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def _database_url() -> str:
    """The test database, as the worker's DATABASE_URL (the same host, port and name, so the
    pools' Redis keys, prefixed by them, are the same on both sides)."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


class Worker:
    def __init__(self, log: Path):
        self.queue = f"test-event-passes-{uuid.uuid4().hex[:8]}"
        self.name = f"{self.queue}@test"
        self.log = log
        env = os.environ | {
            "DJANGO_SETTINGS_MODULE": "tests.scheduling.worker_settings",
            "DATABASE_URL": _database_url(),
            "TEST_CELERY_QUEUE": self.queue,
            # this process's Redis prefix: the one its tasks are sent under
            "DEPLOYMENT_PREFIX": django_settings.DEPLOYMENT_PREFIX,
            "PYTHONUNBUFFERED": "1",
        }
        command = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", self.queue]
        command += ["-n", self.name, "--concurrency", "4", "--pool", "prefork"]
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        command += ["--loglevel", "warning"]
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout=60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the worker exited:\n{self.tail()}"
            if celery_app.control.ping(destination=[self.name], timeout=0.5):
                return
        pytest.fail(f"the worker did not answer within {timeout} s:\n{self.tail()}")

    def stop(self) -> None:
        self.process.terminate()  # a warm shutdown: the tasks it runs finish
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        coalesce.redis_client().delete(self.queue)  # what it had not taken yet

    def tail(self, lines=60) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, tmp_path_factory):
    try:
        redis.Redis.from_url(django_settings.REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        require_service(False, f"Redis at {django_settings.REDIS_URL}")
    with django_db_blocker.unblock():  # the test database's name, set once it was created
        running = Worker(tmp_path_factory.mktemp("celery") / "worker.log")
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture
def events(worker, settings):
    """Event passes on in this process, its tasks sent to the worker's queue, not run inline."""
    settings.SCHEDULER_EVENT_PASSES = True
    settings.SCHEDULER_EVENT_MIN_INTERVAL_S = 0.25  # the default, as the worker has it
    conf = celery_app.conf
    saved = conf.task_always_eager, conf.task_default_queue
    conf.task_always_eager, conf.task_default_queue = False, worker.queue
    yield worker
    conf.task_always_eager, conf.task_default_queue = saved


def fresh_pool(slug: str):
    pool = build_pool(slug, exact_capacity=True)
    state = coalesce.PoolPasses(pool.pk)
    coalesce.redis_client().delete(
        state.wanted_key, state.queued_key, state.ended_key, state.lock_key
    )
    return pool


def wait_for(condition, timeout: float, worker: Worker, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"{what} not within {timeout} s; the worker's log:\n{worker.tail()}")


def quiet(pool, worker: Worker, for_s: float = 1.5, timeout: float = 30.0) -> None:
    """Until no pass of the pool was recorded for `for_s` (the worker is done with it)."""
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = PassRecord.objects.filter(pool=pool).count()
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= for_s:
            return
        time.sleep(0.1)
    pytest.fail(f"the pool's passes never stopped; the worker's log:\n{worker.tail()}")


def holding(pool):
    return Lease.objects.filter(pool=pool, state__in=HOLDING, job__isnull=False)


def in_threads(*targets) -> None:
    errors = []

    def run(target):
        try:
            target()
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors


def test_racing_triggers_never_double_place_nor_overcommit(events):
    pool = fresh_pool("race")
    tenants = [build_tenant(f"race-{i}") for i in range(4)]
    for name in ("n1", "n2"):
        build_node(pool, name, cpu=4000, memory=8192)  # 4 jobs each
    stop = threading.Event()

    def submitter(tenant):
        def run():
            for i in range(10):  # each submit asks for a pass once it commits
                submit_job(pool, tenant, f"{tenant.slug}-{i}", cpu=1000, memory=512)
                time.sleep(0.02)

        return run

    def triggers():  # passes asked for past the coalescing, and beat's pass, meanwhile
        while not stop.wait(0.05):
            tasks.pool_pass.apply_async(args=[pool.pk])
            tasks.scheduling_pass.apply_async()

    trigger = threading.Thread(target=triggers)
    trigger.start()
    try:
        in_threads(*(submitter(t) for t in tenants))
        wait_for(lambda: holding(pool).count() == 8, 20, events, "8 jobs placed")
        # capacity returned while triggers go on: each end asks for a pass that refills it
        for lease in holding(pool).order_by("pk")[:4]:
            lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
        wait_for(lambda: holding(pool).count() == 8, 20, events, "the freed room refilled")
    finally:
        stop.set()
        trigger.join(10)
    quiet(pool, events)

    assert holding(pool).count() == 8
    per_job = list(holding(pool).values_list("job_id", flat=True))
    assert len(per_job) == len(set(per_job))  # no job holds two leases
    assert Job.objects.filter(pool=pool, state=JobState.LEASED).count() == 12  # 4 ended early
    assert overcommitted_nodes(pool) == 0
    assert ledger_problems(pool) == []


def test_two_workers_never_pass_one_pool_at_once(events):
    pool = fresh_pool("overlap")
    tenant = build_tenant("overlap")
    build_node(pool, "n1", cpu=8000, memory=16384)
    specs = [{"tenant": tenant, "name": f"j{i}", "resources": cpu_request(cpu=500, memory=256)}
             for i in range(400)]  # fmt: skip
    submit_jobs(pool, specs)  # a queue that keeps every pass busy: 16 fit, 384 wait
    for _ in range(12):  # every worker process takes one: beat's pass and event passes race
        tasks.pool_pass.apply_async(args=[pool.pk])
        tasks.scheduling_pass.apply_async()
    wait_for(lambda: PassRecord.objects.filter(pool=pool).exists(), 20, events, "a pass")
    quiet(pool, events)

    passes = list(PassRecord.objects.filter(pool=pool).order_by("started_at"))
    assert len(passes) >= 2
    for before, after in pairwise(passes):
        ended = before.started_at.timestamp() + before.duration_s
        assert after.started_at.timestamp() >= ended - 0.002, (before.pk, after.pk)
    assert holding(pool).count() == 16 and ledger_problems(pool) == []


def test_a_burst_of_1000_submits_makes_at_most_20_passes_and_places_every_job(events):
    pool = fresh_pool("burst")
    tenant = build_tenant("burst")
    build_node(pool, "big", cpu=128_000, memory=131_072)  # 1,000 × (100m, 64 MiB) fit
    spec = cpu_request(cpu=100, memory=64)
    began = time.monotonic()
    for batch in range(50):  # 20 jobs a commit, one every 70 ms; each asks for a pass
        submit_jobs(pool, [{"tenant": tenant, "name": f"b{batch}-{i}", "resources": spec}
                           for i in range(20)])  # fmt: skip
        last_submit = time.time()
        time.sleep(max(0.0, began + 0.07 * (batch + 1) - time.monotonic()))
    burst_s = time.monotonic() - began

    leased = Job.objects.filter(pool=pool, state=JobState.LEASED)
    wait_for(lambda: leased.count() == 1000, 30, events, "every job placed")
    quiet(pool, events)
    records = list(PassRecord.objects.filter(pool=pool).order_by("started_at"))
    passes = len(records)
    last_placed = JobEvent.objects.filter(job__pool=pool, to_state=JobState.LEASED).latest("at")
    trailing_s = last_placed.at.timestamp() - last_submit
    print(f"burst {burst_s:.2f} s, {passes} passes, the last job placed {trailing_s:.2f} s later")
    # A burst that a loaded machine stretched past 5 s is held to the same count: passes come
    # at most every interval (plus the pass), so a longer burst only makes fewer per second.
    assert passes <= 20, f"{passes} passes in a burst of {burst_s:.1f} s"
    for before, after in pairwise(records):  # paced: the interval between one's end and the next
        gap = after.started_at.timestamp() - before.started_at.timestamp() - before.duration_s
        assert gap >= 0.25 - 0.01, (before.pk, after.pk, gap)
    assert trailing_s < 5.0  # the trailing edge: placed by a pass after it, not left waiting
    assert ledger_problems(pool) == []
