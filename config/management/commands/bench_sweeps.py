"""python manage.py bench_sweeps --nodes N --jobs M [--rounds R] [--json]

What beat's periodic tasks cost a worker at fleet scale (docs/deployment.md "Scale figures"):
in a throwaway PostgreSQL database (as bench_scheduler makes it, dropped at the end) it builds N
nodes and M jobs (scheduling/bench/scheduler.py's fleet and queue), places them with one pass
and marks the placed ones running on committed leases, every node heartbeating now: a fleet at
work. Then it runs the body of every task of beat's schedule (config/celery.py) R times in this
process, eagerly, as a worker would, and prints for each its median wall time and what share of
one worker process it takes at its period (wall / period); and their sum.
"""

import json
import logging
import statistics
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils import timezone

from config.builders import build_fleet, build_pool, build_tenant, submit_jobs
from config.celery import app
from jobs.choices import JobState
from jobs.models import Job
from leases.choices import LeaseState
from leases.models import Lease
from nodes.models import Node
from scheduling.bench.database import rerun_on_postgresql, throwaway_database
from scheduling.bench.scheduler import fleet_specs, job_specs
from scheduling.passes import scheduling_pass


class Command(BaseCommand):
    help = "Benchmark beat's periodic tasks over a fleet at work (one JSON object with --json)."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=10000)
        parser.add_argument("--jobs", type=int, default=7000)
        parser.add_argument("--tenants", type=int, default=20)
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        rerun_on_postgresql()
        settings.SCHEDULER_EVENT_PASSES = False  # what is measured is beat's, nothing else
        eager = app.conf.task_always_eager
        app.conf.task_always_eager = True  # a task's own sends run in it, counted in its time
        try:
            with throwaway_database("bench_sweeps"):
                result = {**self.build(opts), **self.measure(opts["rounds"])}
        finally:
            app.conf.task_always_eager = eager
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key:>22}: {value}")

    def build(self, opts) -> dict:
        started = time.perf_counter()
        pool = build_pool("bench", registry=None)
        tenants = [build_tenant(f"tenant-{i:02d}") for i in range(opts["tenants"])]
        build_fleet(pool, fleet_specs(opts["nodes"], 1))
        submit_jobs(pool, job_specs(opts["jobs"], tenants, 1))
        settings.SCHEDULER_PASS_MAX_JOBS = max(settings.SCHEDULER_PASS_MAX_JOBS, opts["jobs"])
        scheduling_pass(pool_id=pool.pk)
        # at work: the placed jobs run on committed leases, every node heartbeating now (a bulk
        # write of the states the agents' reports would have made)
        now = timezone.now()
        placed = Job.objects.filter(pool=pool, state=JobState.LEASED)
        running = placed.update(state=JobState.RUNNING)
        Lease.objects.filter(pool=pool, state=LeaseState.RESERVED, job__isnull=False).update(
            state=LeaseState.COMMITTED, committed_at=now
        )
        Node.objects.filter(pool=pool).update(last_heartbeat_at=now)
        return {
            "nodes": opts["nodes"],
            "jobs": opts["jobs"],
            "jobs_running": running,
            "build_s": round(time.perf_counter() - started, 1),
        }

    def measure(self, rounds: int) -> dict:
        app.loader.import_default_modules()  # the apps' tasks modules, as a worker loads them
        logging.getLogger("celery.app.trace").setLevel(logging.WARNING)  # a line per call
        tasks, failed = {}, {}
        for entry in sorted(app.conf.beat_schedule.values(), key=lambda e: e["task"]):
            name, period = entry["task"], float(entry["schedule"])
            task = app.tasks[name]
            walls = []
            for _ in range(rounds):
                started = time.perf_counter()
                result = task.apply(args=entry.get("args", ()), kwargs=entry.get("kwargs", {}))
                walls.append(time.perf_counter() - started)
                if result.failed():
                    failed[name] = repr(result.result)
            wall = statistics.median(walls)
            tasks[name] = {
                "period_s": period,
                "wall_s": round(wall, 4),
                "share_of_a_worker": round(wall / period, 4),
            }
        return {
            "tasks": tasks,
            "share_of_a_worker": round(sum(t["share_of_a_worker"] for t in tasks.values()), 3),
            "failed": failed,
        }
