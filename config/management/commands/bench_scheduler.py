"""python manage.py bench_scheduler --nodes N --jobs M [--tenants T] [--seed S] [--pools K] [--json]

Builds, in a throwaway PostgreSQL database (created and migrated as Django's test runner does,
dropped at the end), N heterogeneous nodes and M queued jobs of mixed shapes and tenants with
config.builders, runs ONE full scheduling pass and prints its figures; the fleet, the queue and
the measurement are scheduling/bench/scheduler.py's. Over SQLite it re-runs itself over
DATABASE_URL, or postgres://postgres@127.0.0.1:5432/computepool.

With `--pools K` (K > 1) it builds K + 1 pools, each with the same seeded fleet and queue (the
same tenants and priority classes), all before anything is measured, then runs, through the
Celery task's own body (`scheduling.tasks.pool_pass`: the pool's advisory lock, one pass of its
whole queue), the first pool's pass alone and then the K others' passes at the same time, each
in its own process (scheduling/bench/parallel.py), and prints both, their ratio and the lock
waits sampled meanwhile.
"""

import json
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from config.builders import build_fleet, build_pool, build_tenant, submit_jobs
from pools.models import PriorityClass
from scheduling.bench.database import rerun_on_postgresql, throwaway_database
from scheduling.bench.parallel import run_passes
from scheduling.bench.scheduler import (
    fleet_specs,
    job_specs,
    jobs_without_one_lease,
    measure,
    overcommitted_nodes,
)


class Command(BaseCommand):
    help = "Benchmark one scheduling pass in a throwaway database (one JSON object with --json)."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=5000)
        parser.add_argument("--jobs", type=int, default=20000)
        parser.add_argument("--tenants", type=int, default=20)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--pools", type=int, default=1, help="K > 1: K pools in parallel")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        rerun_on_postgresql()
        # the measured pass is the only one: the submits ask no worker for another
        settings.SCHEDULER_EVENT_PASSES = False
        with throwaway_database("bench_scheduler"):
            result = self.run_pools(opts) if opts["pools"] > 1 else self.run_once(opts)
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key:>22}: {value}")

    def run_once(self, opts) -> dict:
        started = time.perf_counter()
        pool = build_pool("bench", registry=None)
        tenants = [build_tenant(f"tenant-{i:02d}") for i in range(opts["tenants"])]
        priorities = [
            PriorityClass.objects.create(name=f"bench-{value}", value=value)
            for value in (100, 500, 1000)
        ]
        build_fleet(pool, fleet_specs(opts["nodes"], opts["seed"]))
        submit_jobs(pool, job_specs(opts["jobs"], tenants, opts["seed"], priorities))
        built = time.perf_counter() - started
        return {"seed": opts["seed"], "build_s": round(built, 1), **measure(pool)}

    def run_pools(self, opts) -> dict:
        """K + 1 pools built alike; the first's pass alone, then the K others' together."""
        started = time.perf_counter()
        tenants = [build_tenant(f"tenant-{i:02d}") for i in range(opts["tenants"])]
        priorities = [
            PriorityClass.objects.create(name=f"bench-{value}", value=value)
            for value in (100, 500, 1000)
        ]
        pools = []
        for i in range(opts["pools"] + 1):
            pool = build_pool(f"bench-{i}", registry=None)
            build_fleet(pool, fleet_specs(opts["nodes"], opts["seed"]))
            submit_jobs(pool, job_specs(opts["jobs"], tenants, opts["seed"], priorities))
            pools.append(pool)
        built = time.perf_counter() - started
        # the task's pass takes a window of the queue; here, as measure() does, all of it
        settings.SCHEDULER_PASS_MAX_JOBS = max(settings.SCHEDULER_PASS_MAX_JOBS, opts["jobs"])
        single = run_passes(pools[:1])
        parallel = run_passes(pools[1:])
        over = [overcommitted_nodes(pool) for pool in pools]
        without = [jobs_without_one_lease(pool) for pool in pools]
        return {
            "seed": opts["seed"],
            "build_s": round(built, 1),
            "pools": opts["pools"],
            "pools_built": len(pools),
            "layout": (
                f"{len(pools)} pools built alike before any pass; {pools[0].slug} passed alone, "
                f"then the other {opts['pools']} at once, each in its own process"
            ),
            "nodes_per_pool": opts["nodes"],
            "jobs_per_pool": opts["jobs"],
            "single": single,
            "parallel": parallel,
            "parallel_over_single": round(
                parallel["placements_per_s"] / single["placements_per_s"], 2
            ),
            "lock_wait_samples": parallel["lock_sampling"]["samples_with_lock_wait"],
            "overcommitted_nodes": sum(over),
            "jobs_without_one_lease": sum(without),
        }
