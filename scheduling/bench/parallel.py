"""Passes of several pools at the same time (issue 20: "passes of different pools run in
parallel on different Celery workers without lock waits").

`run_passes(pool_ids)` runs each pool's pass in its own process, forked from the caller once
the pools are built (so each is as warm as a Celery worker's process that has imported the
project), with its own fresh database connection opened before the start. The processes wait
at a barrier, then each runs the body of the Celery task `scheduling.pool_pass` — the pool's
lock (`coalesce.run_exclusive`: the PostgreSQL advisory lock), its window read, ONE pass —
exactly as a worker runs it. Meanwhile a thread of the caller samples, from a separate
connection, every `SAMPLE_EVERY_S`, the database's lock waits (`pg_locks` not granted, and
`pg_stat_activity` backends whose wait event is of type Lock) and what the other active
backends wait on.

`bench_scheduler --pools K` calls it twice on pools built the same way: one pool alone, then K
others together (scheduling/bench/scheduler.py builds the fleets and queues).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from collections import Counter

import psycopg
from django.db import connection, connections

from scheduling.models import PassRecord

SAMPLE_EVERY_S = 0.02

_WAITS = """
SELECT l.locktype, l.mode FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = %(db)s
"""
_ACTIVE = """
SELECT backend_type, wait_event_type, wait_event FROM pg_stat_activity
WHERE datname = %(db)s AND pid <> pg_backend_pid()
  AND (state = 'active' OR backend_type = 'autovacuum worker')
"""


class LockSampler(threading.Thread):
    """Samples the database's lock waits from its own connection until `stop()`."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S, params: dict | None = None):
        """`params`: psycopg's connection arguments; by default Django's database's."""
        super().__init__(daemon=True)
        db = connection.settings_dict
        self.params = params or {
            "host": db["HOST"] or None,
            "port": db["PORT"] or None,
            "user": db["USER"] or None,
            "password": db["PASSWORD"] or None,
            "dbname": db["NAME"],
        }
        self.every_s, self.began = every_s, time.monotonic()
        self.halt = threading.Event()
        self.samples = self.with_lock_wait = self.with_autovacuum = 0
        self.lock_types: Counter = Counter()
        self.waits: Counter = Counter()

    def run(self) -> None:
        with psycopg.connect(autocommit=True, **self.params) as conn:
            self.began = time.monotonic()
            args = {"db": self.params["dbname"]}
            while not self.halt.is_set():
                waiting = conn.execute(_WAITS, args).fetchall()
                active = conn.execute(_ACTIVE, args).fetchall()
                self.samples += 1
                locked = [row for row in active if row[1] == "Lock"]
                if waiting or locked:
                    self.with_lock_wait += 1
                self.lock_types.update(f"{locktype} {mode}" for locktype, mode in waiting)
                self.with_autovacuum += any(row[0] == "autovacuum worker" for row in active)
                # what the active backends wait on (none: on the CPU), by kind where not a
                # client's backend (a parallel query's workers, autovacuum)
                self.waits.update(
                    ("" if backend == "client backend" else f"{backend} ")
                    + f"{kind or 'none'}:{event or '-'}"
                    for backend, kind, event in active
                )
                self.halt.wait(self.every_s)

    def stop(self) -> dict:
        self.halt.set()
        self.join()
        return {
            "seconds": round(time.monotonic() - self.began, 2),
            "samples": self.samples,
            "samples_with_lock_wait": self.with_lock_wait,
            "lock_types": dict(self.lock_types.most_common()),
            "samples_with_autovacuum": self.with_autovacuum,
            "backend_waits": dict(self.waits.most_common()),
        }


def _cpu_jiffies() -> tuple[int, int]:
    """The machine's (busy, total) CPU time so far, from /proc/stat (Linux); (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _one_pool(pool_id: int, barrier, results) -> None:
    """A worker process: a fresh connection, the start, the task's body, its figures."""
    try:
        from scheduling.tasks import pool_pass  # the Celery task; called, it runs here

        connection.ensure_connection()
        barrier.wait()
        started = time.monotonic()
        outcome = pool_pass(pool_id)
        ended = time.monotonic()
        results.put(
            {"pool_id": pool_id, "start": started, "end": ended, "placed": len(outcome["placed"])}
        )
    except BaseException:
        results.put({"pool_id": pool_id, "error": traceback.format_exc()})
    finally:
        connections.close_all()


def run_passes(pools: list) -> dict:
    """Each pool's pass in its own process, all started together; their figures, the group's
    wall time (first start to last end) and placements/s, and what the lock sampler saw."""
    load_1m = os.getloadavg()[0]
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(len(pools) + 1), context.Queue()
    connections.close_all()  # the children open their own
    workers = [context.Process(target=_one_pool, args=(p.pk, barrier, results)) for p in pools]
    for worker in workers:
        worker.start()
    sampler = LockSampler()  # started after the forks: no child inherits its connection
    sampler.start()
    barrier.wait(timeout=300)  # every child connected: the passes start together
    released, cpu_before = time.monotonic(), _cpu_jiffies()
    rows = [results.get(timeout=1800) for _ in workers]
    collected, cpu_after = time.monotonic(), _cpu_jiffies()
    sampled = {**sampler.stop(), "before_start_s": round(released - sampler.began, 2)}
    for worker in workers:
        worker.join()
    exited_s = time.monotonic() - collected
    errors = [row["error"] for row in rows if "error" in row]
    if errors:
        raise RuntimeError("a pool's pass failed:\n" + "\n".join(errors))
    first, last = min(r["start"] for r in rows), max(r["end"] for r in rows)
    sampled["after_end_s"] = round(collected - last, 2)  # until the last figures came back
    sampled["workers_exited_after_s"] = round(exited_s, 2)
    slug = {p.pk: p.slug for p in pools}
    per_pool = []
    for row in sorted(rows, key=lambda r: slug[r["pool_id"]]):
        records = PassRecord.objects.filter(pool_id=row["pool_id"])
        record = records.latest("started_at", "id")
        wall_s = row["end"] - row["start"]
        per_pool.append(
            {
                "pool": slug[row["pool_id"]],
                "placed": row["placed"],
                "seconds": round(wall_s, 3),
                "placements_per_s": round(row["placed"] / wall_s, 1),
                "started_at_s": round(row["start"] - first, 3),
                "ended_at_s": round(row["end"] - first, 3),
                "passes": records.count(),  # 1: the lock was taken, the pass ran once
                "pass_s": round(record.duration_s, 3),
                "snapshot_s": round(record.snapshot_s or 0.0, 3),
                "plan_s": round(record.plan_s or 0.0, 3),
                "apply_s": round(record.apply_s or 0.0, 3),
            }
        )
    placed = sum(row["placed"] for row in rows)
    # the whole machine's busy CPUs on average from the start to the last figures: every
    # process counts (PostgreSQL, the passes, the sampler, and whatever else runs)
    total = cpu_after[1] - cpu_before[1]
    busy = (cpu_after[0] - cpu_before[0]) / total * (os.cpu_count() or 1) if total else None
    busy_cpus = round(busy, 2) if busy is not None else None
    return {
        "pools": per_pool,
        "wall_s": round(last - first, 3),
        "placed": placed,
        "placements_per_s": round(placed / (last - first), 1),
        "load_1m_before": round(load_1m, 2),
        "busy_cpus": busy_cpus,
        "cpus": os.cpu_count(),
        "lock_sampling": sampled,
    }
