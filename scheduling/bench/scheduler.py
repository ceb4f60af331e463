"""The scheduling-pass benchmark: one full pass over a large queue on a large, mixed fleet.

`manage.py bench_scheduler --nodes N --jobs M` (config/management/commands) makes a throwaway
PostgreSQL database, builds the pool with config.builders from `fleet_specs` and `job_specs`
(seeded: the same arguments build the same fleet and queue), then calls `measure`, which runs
ONE pass of every queued job (`passes.pool_pass`, as a scheduling pass runs each pool) and
reads its figures back from the database: the pass's own record (`PassRecord`: its duration
and phases) and what it wrote.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter, defaultdict

import orjson
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job, JobEvent
from leases.choices import HOLDING
from leases.models import Lease, LeaseEvent
from nodes.models import GpuDevice, Node
from scheduling.models import PassRecord
from scheduling.passes import PassResult, pool_pass

IMAGE = "127.0.0.1:5000/computepool/bench@sha256:" + "b" * 64
ZONES = (("eu-west", "eu-west-a"), ("eu-west", "eu-west-b"), ("us-east", "us-east-a"))
ZONES += (("us-east", "us-east-b"),)
DRIVER = {"driver_version": "550.54.15", "cuda_version": "12.4"}

# Node kinds, by share of the fleet: (name, share, cpu, memory MiB, GPUs)
A100 = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "interconnect_group": "nvl0"}
H100_MIG = {"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "mig_enabled": True}
L4 = {"model": "NVIDIA L4", "memory_mib": 23034, "interconnect_group": ""}
T4_SHARED = {"model": "Tesla T4", "memory_mib": 15360, "sharing_mode": "timeslice"}
NODE_KINDS = (
    ("cpu", 0.40, 64_000, 262_144, ()),
    ("ram", 0.15, 32_000, 1_048_576, ()),
    ("a100", 0.15, 128_000, 1_048_576, (A100,) * 8),
    ("h100mig", 0.10, 128_000, 1_048_576, (H100_MIG,) * 8),
    ("l4", 0.12, 48_000, 196_608, (L4,) * 4),
    ("t4", 0.08, 32_000, 131_072, (T4_SHARED,) * 4),
)

# Job shapes, by share of the queue: (share, request fields)
_CPU = {"gpu_sharing_class": "none", "gpu_count": 0}
JOB_SHAPES = (
    (0.25, {"cpu_millicores_min": 2000, "memory_mib_min": 4096, **_CPU}),
    (0.15, {"cpu_millicores_min": 8000, "memory_mib_min": 32768, **_CPU}),
    (0.08, {"cpu_millicores_min": 4000, "memory_mib_min": 262144, **_CPU}),
    (0.04, {"cpu_millicores_min": 2000, "memory_mib_min": 8192, "zones": ["eu-west-a"], **_CPU}),
    (0.12, {"cpu_millicores_min": 8000, "memory_mib_min": 65536, "gpu_sharing_class": "exclusive",
            "gpu_count": 1}),
    (0.04, {"cpu_millicores_min": 32000, "memory_mib_min": 262144,
            "gpu_sharing_class": "exclusive", "gpu_count": 4, "gpu_memory_mib_min": 40960}),
    (0.08, {"cpu_millicores_min": 4000, "memory_mib_min": 16384, "gpu_sharing_class": "mig",
            "gpu_count": 1, "mig_profile": "1g.10gb"}),
    (0.04, {"cpu_millicores_min": 8000, "memory_mib_min": 65536, "gpu_sharing_class": "mig",
            "gpu_count": 1, "mig_profile": "3g.40gb"}),
    (0.12, {"cpu_millicores_min": 2000, "memory_mib_min": 8192,
            "gpu_sharing_class": "timeslice", "gpu_count": 1, "gpu_milli": 250}),
    (0.08, {"cpu_millicores_min": 8000, "memory_mib_min": 32768,
            "gpu_sharing_class": "exclusive", "gpu_count": 1, "gpu_models": ["NVIDIA L4"]}),
)  # fmt: skip


def fleet_specs(count: int, seed: int = 1) -> list[dict]:
    """`count` node specs for config.builders.build_fleet: the kinds of NODE_KINDS in their
    shares, spread over ZONES and racks."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        kind, _, cpu, memory, gpus = rng.choices(NODE_KINDS, [k[1] for k in NODE_KINDS])[0]
        region, zone = ZONES[i % len(ZONES)]
        devices = [{**g, **DRIVER, "numa_node": j // 4} for j, g in enumerate(gpus)]
        specs.append(
            {
                "name": f"{kind}-{i:05d}",
                "cpu": cpu,
                "memory": memory,
                "scratch": 1_000_000,
                "gpus": devices,
                "region": region,
                "zone": zone,
                "rack": f"{zone}-r{i % 40:02d}",
            }
        )
    return specs


def job_specs(count: int, tenants: list, seed: int = 1, priorities=()) -> list[dict]:
    """`count` job specs for config.builders.submit_jobs: shapes of JOB_SHAPES in their shares,
    tenants and priority classes (`priorities`, may be empty) drawn at random."""
    rng = random.Random(seed + 1)
    specs = []
    for i in range(count):
        _, request = rng.choices(JOB_SHAPES, [shape[0] for shape in JOB_SHAPES])[0]
        spec = {
            "tenant": rng.choice(tenants),
            "name": f"bench-{i}",
            "resources": dict(request),
            "image": IMAGE,
            "image_platforms": ["linux/amd64"],
        }
        if priorities:
            spec["priority_class"] = rng.choice(priorities)
        specs.append(spec)
    return specs


def measure(pool) -> dict:
    """ONE pass of every queued job of `pool`; its figures as the pass recorded them (its
    PassRecord: duration and phases), then what the database holds."""
    job_ids = list(
        Job.objects.filter(pool=pool, state=JobState.QUEUED)
        .order_by("id")
        .values_list("id", flat=True)
    )
    result = PassResult()
    backend_before, process_before = _backend_cpu_s(), time.process_time()
    pool_pass(pool.pk, job_ids, timezone.now(), result)
    process_cpu_s = time.process_time() - process_before
    backend_after = _backend_cpu_s()
    record = PassRecord.objects.filter(pool=pool).latest("started_at", "id")
    unplaced = Counter(
        (reason or {}).get("code", "none")
        for reason in Job.objects.filter(pool=pool, state=JobState.QUEUED).values_list(
            "pending_reason", flat=True
        )
    )
    floor_s = write_floor(pool, job_ids)
    apply_s = record.apply_s or 0.0
    return {
        "nodes": Node.objects.filter(pool=pool).count(),
        "jobs": len(job_ids),
        "placed": record.placed,
        "placements_per_s": round(record.placed / record.duration_s, 1),
        "pass_s": round(record.duration_s, 3),
        "snapshot_s": round(record.snapshot_s or 0.0, 3),
        "plan_s": round(record.plan_s or 0.0, 3),
        "apply_s": round(apply_s, 3),
        # the same rows written the fastest way (COPY and batched guarded UPDATEs), rolled back
        "floor_s": round(floor_s, 3),
        "apply_over_floor": round(apply_s / floor_s, 2) if floor_s else None,
        **_cpu_figures(record, process_cpu_s, backend_before, backend_after),
        "unplaced_by_reason": dict(unplaced.most_common()),
        "overcommitted_nodes": overcommitted_nodes(pool),
        "jobs_without_one_lease": jobs_without_one_lease(pool),
    }


def _backend_cpu_s() -> float | None:
    """CPU seconds the database backend of this connection has used (user + system), read from
    /proc: None where PostgreSQL is not on this machine or /proc is not readable."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_figures(record, process_cpu_s: float, backend_before, backend_after) -> dict:
    """What the pass cost in CPU, and the fastest it could be on this machine's cores with that
    cost: the Python side is one thread (the GIL), so a pass takes at least its process's CPU
    time, and at least the whole CPU time shared over every core (the backend's included)."""
    cores = os.cpu_count() or 1
    figures = {"pass_process_cpu_s": round(process_cpu_s, 3), "cores": cores}
    if backend_before is not None and backend_after is not None:
        backend_cpu_s = backend_after - backend_before
        bound_s = max(process_cpu_s, (process_cpu_s + backend_cpu_s) / cores)
        figures["pass_backend_cpu_s"] = round(backend_cpu_s, 3)
        figures["cpu_bound_placements_per_s"] = round(record.placed / bound_s, 1)
    return figures


def overcommitted_nodes(pool) -> int:
    """Nodes where the holding leases (not the ledger columns) hold more than allocatable: CPU,
    memory, scratch, a GPU's milli, or overlapping MIG memory slices."""
    rows = Lease.objects.filter(pool=pool, state__in=HOLDING, backfill_of__isnull=True).values_list(
        "node_id", "cpu_millicores", "memory_mib", "scratch_mib", "gpu_allocations"
    )
    rows = list(rows)
    allocatable = Node.objects.filter(pk__in={row[0] for row in rows}).values_list(
        "id", "cpu_millicores_allocatable", "memory_mib_allocatable", "scratch_mib_allocatable"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, node_id FROM {GpuDevice._meta.db_table} WHERE id = ANY(%s)",
            [list({a["gpu"] for row in rows for a in row[4]})],
        )
        gpu_nodes = dict(cursor.fetchall())
    limits = {node_id: tuple(limit) for node_id, *limit in allocatable}
    return len(overcommitted(rows, limits, gpu_nodes))


def overcommitted(rows, allocatable: dict, gpu_nodes: dict) -> set[int]:
    """The nodes that `rows` (node id, CPU, memory, scratch, GPU allocations: leases holding at
    one moment) hold more of than `allocatable` ({node id: (CPU, memory, scratch)}): a
    resource, a GPU's milli (`gpu_nodes`: {GPU id: node id}), or overlapping MIG slices. The
    drill's audit (config/drill/audit.py) asks it of every moment a lease began to hold."""
    held: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    gpu_milli: dict[int, int] = defaultdict(int)
    gpu_slots: dict[int, int] = defaultdict(int)
    over = set()
    for node_id, cpu, memory, scratch, allocations in rows:
        total = held[node_id]
        total[0] += cpu
        total[1] += memory
        total[2] += scratch
        for alloc in allocations:
            if alloc.get("mig_slots"):
                if gpu_slots[alloc["gpu"]] & alloc["mig_slots"]:
                    over.add(node_id)
                gpu_slots[alloc["gpu"]] |= alloc["mig_slots"]
            else:
                gpu_milli[alloc["gpu"]] += alloc["milli"]
    for node_id, totals in held.items():
        limits = allocatable.get(node_id)
        if limits and any(h > limit for h, limit in zip(totals, limits, strict=True)):
            over.add(node_id)
    over |= {
        gpu_nodes[gpu] for gpu, milli in gpu_milli.items() if milli > 1000 and gpu in gpu_nodes
    }
    return over


def jobs_without_one_lease(pool) -> int:
    """Leased jobs that do not hold exactly one lease (0 when nothing was placed twice)."""
    holding = Count("leases", filter=Q(leases__state__in=HOLDING))
    leased = Job.objects.filter(pool=pool, state=JobState.LEASED)
    return leased.annotate(holding=holding).exclude(holding=1).count()


# --- the write floor ---------------------------------------------------------------------------


class _Rollback(Exception):
    pass


def write_floor(pool, job_ids) -> float:
    """Seconds the database takes for what the pass's apply wrote, written the fastest way
    there is: COPY of the same lease, lease-event and job-event rows, the same jobs UPDATE, and
    one batched guarded UPDATE of the same nodes and GPUs, in one transaction on the same
    database, rolled back. The rows are read first (not timed) with COPY TO; new lease ids come
    from the sequence and idempotency keys get a suffix, so the copies collide with nothing. The
    ledger columns are first given back what the pass took (not timed), so the guarded UPDATE
    takes the same amounts against the same limits."""
    lease_t, lease_event_t = Lease._meta.db_table, LeaseEvent._meta.db_table
    job_t, job_event_t = Job._meta.db_table, JobEvent._meta.db_table
    lease_cols = [f.column for f in Lease._meta.concrete_fields if f.column != "id"]
    key = "CASE WHEN idempotency_key = '' THEN '' ELSE idempotency_key || '~floor' END"
    selected = ", ".join(key if c == "idempotency_key" else c for c in lease_cols)
    ids = list(job_ids)
    try:
        with transaction.atomic(), connection.cursor() as django_cursor:
            cursor = django_cursor.cursor  # psycopg 3's own, for COPY
            lease_rows = _copy_out(
                cursor,
                f"SELECT {selected} FROM {lease_t} WHERE job_id = ANY(%s) AND state = 'reserved'",
                [ids],
            )
            event_cols = [f.column for f in LeaseEvent._meta.concrete_fields if f.column != "id"]
            lease_events = _copy_out(
                cursor,
                f"SELECT {', '.join(event_cols)} FROM {lease_event_t} WHERE lease_id IN "
                f"(SELECT id FROM {lease_t} WHERE job_id = ANY(%s))",
                [ids],
            )
            job_event_cols = [f.column for f in JobEvent._meta.concrete_fields if f.column != "id"]
            job_events = _copy_out(
                cursor,
                f"SELECT {', '.join(job_event_cols)} FROM {job_event_t} "
                "WHERE job_id = ANY(%s) AND reason = 'placed'",
                [ids],
            )
            nodes, gpus = _ledger_amounts(cursor, ids)
            _give_back(cursor, nodes, gpus)
            started = time.perf_counter()
            _copy_in(cursor, lease_t, lease_cols, lease_rows)
            _copy_in(cursor, lease_event_t, event_cols, lease_events)
            cursor.execute(
                f"UPDATE {job_t} SET state = 'leased', state_changed_at = now(), "
                "attempts = attempts + 1, pending_reason = '{}'::jsonb WHERE id = ANY(%s)",
                [ids],
            )
            _copy_in(cursor, job_event_t, job_event_cols, job_events)
            _take(cursor, nodes, gpus)
            elapsed = time.perf_counter() - started
            raise _Rollback
    except _Rollback:
        return elapsed


def _copy_out(cursor, query: str, params) -> bytes:
    with cursor.copy(f"COPY ({cursor.mogrify(query, params)}) TO STDOUT") as copy:
        return b"".join(bytes(block) for block in copy)


def _copy_in(cursor, table: str, columns: list[str], data: bytes) -> None:
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        copy.write(data)


def _ledger_amounts(cursor, job_ids) -> tuple[str, str]:
    """What the pass's leases took per node and per GPU, as JSON recordsets."""
    cursor.execute(
        f"SELECT COALESCE(json_agg(t), '[]') FROM (SELECT node_id AS id, "
        "sum(cpu_millicores) AS cpu, sum(memory_mib) AS mem, sum(scratch_mib) AS disk "
        f"FROM {Lease._meta.db_table} WHERE job_id = ANY(%s) AND state = 'reserved' "
        "GROUP BY node_id) t",
        [job_ids],
    )
    nodes = cursor.fetchone()[0]
    cursor.execute(
        "SELECT COALESCE(json_agg(t), '[]') FROM (SELECT (a->>'gpu')::bigint AS id, "
        "sum((a->>'milli')::int) AS milli FROM "
        f"{Lease._meta.db_table}, jsonb_array_elements(gpu_allocations) a "
        "WHERE job_id = ANY(%s) AND state = 'reserved' AND COALESCE((a->>'mig_slots')::int, 0) = 0 "
        "GROUP BY 1) t",
        [job_ids],
    )
    return _json(nodes), _json(cursor.fetchone()[0])


def _json(value) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _give_back(cursor, nodes: str, gpus: str) -> None:
    cursor.execute(
        f"UPDATE {Node._meta.db_table} n SET cpu_millicores_reserved = "
        "n.cpu_millicores_reserved - v.cpu, memory_mib_reserved = n.memory_mib_reserved - v.mem, "
        "scratch_mib_reserved = n.scratch_mib_reserved - v.disk "
        "FROM json_to_recordset(%s) AS v(id bigint, cpu int, mem int, disk int) WHERE n.id = v.id",
        [nodes],
    )
    cursor.execute(
        f"UPDATE {GpuDevice._meta.db_table} g SET milli_reserved = g.milli_reserved - v.milli "
        "FROM json_to_recordset(%s) AS v(id bigint, milli int) WHERE g.id = v.id",
        [gpus],
    )


def _take(cursor, nodes: str, gpus: str) -> None:
    """The guarded UPDATEs the apply makes, batched: each row only while it still has room."""
    cursor.execute(
        f"UPDATE {Node._meta.db_table} n SET cpu_millicores_reserved = "
        "n.cpu_millicores_reserved + v.cpu, memory_mib_reserved = n.memory_mib_reserved + v.mem, "
        "scratch_mib_reserved = n.scratch_mib_reserved + v.disk "
        "FROM json_to_recordset(%s) AS v(id bigint, cpu int, mem int, disk int) WHERE n.id = v.id "
        "AND n.cpu_millicores_reserved + v.cpu <= n.cpu_millicores_allocatable "
        "AND n.memory_mib_reserved + v.mem <= n.memory_mib_allocatable "
        "AND n.scratch_mib_reserved + v.disk <= n.scratch_mib_allocatable",
        [nodes],
    )
    cursor.execute(
        f"UPDATE {GpuDevice._meta.db_table} g SET milli_reserved = g.milli_reserved + v.milli "
        "FROM json_to_recordset(%s) AS v(id bigint, milli int) WHERE g.id = v.id "
        "AND g.milli_reserved + v.milli <= 1000",
        [gpus],
    )
