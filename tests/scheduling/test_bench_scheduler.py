"""The scheduling-pass benchmark: its fleet and queue, its figures, its throwaway database, and
the bulk builders it seeds with (the same rows the services write one at a time)."""

import json
import os
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import psycopg
import pytest
from django.conf import settings

from config.builders import build_fleet, build_node, build_tenant, submit_job, submit_jobs
from jobs.models import Job
from nodes.models import GpuDevice, Node, NodeEvent
from scheduling.bench.database import DEFAULT_URL
from scheduling.bench.scheduler import fleet_specs, job_specs, measure, write_floor

NODE_FIELDS = (
    "state",
    "reachability",
    "cpu_millicores_allocatable",
    "memory_mib_allocatable",
    "scratch_mib_allocatable",
    "cpu_millicores_raw",
    "inventory",
)


def test_build_fleet_writes_what_build_node_writes(pool):
    gpus = [{}, {"sharing_mode": "timeslice"}]
    one = build_node(pool, "one", cpu=8000, memory=16384, scratch=100, gpus=gpus)
    (bulk,) = build_fleet(pool, [{"name": "bulk", "cpu": 8000, "memory": 16384, "scratch": 100,
                                   "gpus": gpus}])  # fmt: skip
    rows = Node.objects.filter(pk__in=[one.pk, bulk.pk]).values(*NODE_FIELDS)
    inventory = [dict(r, inventory={**r["inventory"], "gpus": None}) for r in rows]
    assert inventory[0] == inventory[1]
    devices = [
        list(GpuDevice.objects.filter(node=n).order_by("index").values("model", "sharing_mode"))
        for n in (one, bulk)
    ]
    assert devices[0] == devices[1]
    events = [
        list(NodeEvent.objects.filter(node=n).order_by("id").values_list("to_state", "reason"))
        for n in (one, bulk)
    ]
    assert events[0] == events[1]


def test_submit_jobs_writes_what_submit_job_writes(pool, tenant):
    build_node(pool, "n1")
    one = submit_job(pool, tenant, "one", cpu=500, memory=256)
    (bulk,) = submit_jobs(pool, [{"tenant": tenant, "name": "bulk", "resources": one.resources}])
    fields = ("state", "resources", "image", "image_requested", "tenant_id", "pool_id")
    rows = list(Job.objects.filter(pk__in=[one.pk, bulk.pk]).order_by("id").values(*fields))
    assert rows[0] == rows[1]
    assert [list(j.events.values_list("to_state", "reason")) for j in (one, bulk)] == [
        [("queued", "submitted")]
    ] * 2


def test_one_measured_pass_places_without_overcommitting(pool):
    tenants = [build_tenant(f"bench-{i}") for i in range(3)]
    build_fleet(pool, fleet_specs(40, seed=3))
    submit_jobs(pool, job_specs(300, tenants, seed=3))
    figures = measure(pool)
    assert figures["nodes"] == 40 and figures["jobs"] == 300
    assert figures["placed"] + sum(figures["unplaced_by_reason"].values()) == 300
    assert figures["placed"] > 100 and figures["placements_per_s"] > 0
    assert set(figures["unplaced_by_reason"]) <= {"no_capacity"}
    assert figures["overcommitted_nodes"] == 0 and figures["jobs_without_one_lease"] == 0
    for phase in ("snapshot_s", "plan_s", "apply_s"):
        assert 0 < figures[phase] <= figures["pass_s"]
    # the write floor: the same rows, COPY and batched guarded UPDATEs, rolled back
    assert figures["floor_s"] > 0 and figures["apply_over_floor"] > 0
    ratio = figures["apply_s"] / figures["floor_s"]  # of the rounded figures: near, not equal
    assert abs(figures["apply_over_floor"] - ratio) <= 0.05 * ratio
    # the pass's CPU: its own process (one thread of Python) and its database backend (local
    # here, read from /proc), and the rate those costs allow on this machine's cores at best
    assert figures["pass_process_cpu_s"] > 0 and figures["pass_backend_cpu_s"] > 0
    bound_s = max(
        figures["pass_process_cpu_s"],
        (figures["pass_process_cpu_s"] + figures["pass_backend_cpu_s"]) / figures["cores"],
    )
    assert figures["cpu_bound_placements_per_s"] == pytest.approx(
        figures["placed"] / bound_s, rel=0.01
    )


def test_the_floor_writes_what_the_apply_wrote_and_leaves_nothing_behind(pool):
    from leases.models import Lease, LeaseEvent
    from leases.selectors import ledger_problems
    from nodes.models import Node

    tenants = [build_tenant("floor-a")]
    build_fleet(pool, fleet_specs(40, seed=3))  # every kind of node: every job fits some
    submit_jobs(pool, job_specs(60, tenants, seed=3))
    figures = measure(pool)
    assert figures["placed"] > 0
    counts = (Lease.objects.count(), LeaseEvent.objects.count())
    reserved = list(Node.objects.order_by("pk").values_list("cpu_millicores_reserved", flat=True))
    job_ids = list(Lease.objects.values_list("job_id", flat=True))
    assert write_floor(pool, job_ids) > 0
    assert (Lease.objects.count(), LeaseEvent.objects.count()) == counts  # rolled back
    after = list(Node.objects.order_by("pk").values_list("cpu_millicores_reserved", flat=True))
    assert after == reserved and ledger_problems(pool) == []


def test_the_fleet_and_queue_are_mixed_and_seeded():
    specs = fleet_specs(400, seed=5)
    assert specs == fleet_specs(400, seed=5)
    kinds = {spec["name"].split("-")[0] for spec in specs}
    assert kinds == {"cpu", "ram", "a100", "h100mig", "l4", "t4"}
    assert len({spec["zone"] for spec in specs}) == 4
    assert any(g.get("mig_enabled") for spec in specs for g in spec["gpus"])
    jobs = job_specs(400, ["a", "b"], seed=5)
    classes = {job["resources"]["gpu_sharing_class"] for job in jobs}
    assert classes == {"none", "exclusive", "mig", "timeslice"}


def _bench_databases() -> set[str]:
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres"
    ) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench_scheduler_%'"
        )
        return {row[0] for row in rows}


def test_the_command_prints_its_figures_and_drops_its_database():
    before = _bench_databases()
    done = subprocess.run(
        [sys.executable, "manage.py", "bench_scheduler", "--nodes", "20", "--jobs", "60", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("placements_per_s", "snapshot_s", "plan_s", "apply_s", "placed"):
        assert key in figures
    assert figures["overcommitted_nodes"] == 0 and "unplaced_by_reason" in figures
    assert _bench_databases() == before


def test_the_command_passes_two_pools_at_once_and_drops_its_database():
    before = _bench_databases()
    done = subprocess.run(
        [sys.executable, "manage.py", "bench_scheduler", "--nodes", "20", "--jobs", "60",
         "--pools", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["pools"] == 2 and figures["pools_built"] == 3
    for key in ("parallel_over_single", "lock_wait_samples", "jobs_without_one_lease"):
        assert key in figures
    single, parallel = figures["single"], figures["parallel"]
    assert [p["pool"] for p in single["pools"]] == ["bench-0"]
    assert [p["pool"] for p in parallel["pools"]] == ["bench-1", "bench-2"]
    for pool in single["pools"] + parallel["pools"]:
        assert pool["placed"] > 0 and pool["passes"] == 1 and pool["seconds"] > 0
    for group in (single, parallel):
        assert group["placed"] == sum(p["placed"] for p in group["pools"])
        assert group["wall_s"] > 0 and group["lock_sampling"]["samples"] > 0
    assert figures["overcommitted_nodes"] == 0 and figures["jobs_without_one_lease"] == 0
    assert _bench_databases() == before


def test_the_lock_sampler_sees_a_lock_wait():
    """What the parallel passes report as 0 lock waits is seen when there is one: a session
    waiting for an advisory lock another holds (on the PostgreSQL server the command uses)."""
    from scheduling.bench.parallel import LockSampler

    url = urlparse(os.environ.get("DATABASE_URL") or "")
    if url.scheme not in ("postgres", "postgresql"):
        url = urlparse(DEFAULT_URL)
    params = {"host": url.hostname, "port": url.port or 5432, "user": url.username,
              "password": url.password, "dbname": "postgres"}  # fmt: skip
    sampler = LockSampler(every_s=0.005, params=params)
    with psycopg.connect(autocommit=True, **sampler.params) as holder:
        holder.execute("SELECT pg_advisory_lock(42)")
        with psycopg.connect(autocommit=True, **sampler.params) as waiter:
            thread = threading.Thread(target=waiter.execute, args=["SELECT pg_advisory_lock(42)"])
            thread.start()
            sampler.start()
            time.sleep(0.2)
            seen = sampler.stop()
            holder.execute("SELECT pg_advisory_unlock(42)")
            thread.join()
    assert seen["samples_with_lock_wait"] > 0
    assert "advisory ExclusiveLock" in seen["lock_types"]
