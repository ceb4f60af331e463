"""The drill's verdict, read from what it left: the drill's own database (psycopg, directly) and
the Docker engine's own events, never from what the control plane says of itself.

- overcommitted_nodes: at every moment a lease began to hold, what the holding leases of its
  node held against the node's allocatable (scheduling.bench.scheduler.overcommitted, the
  bench's own check, over the leases' history);
- jobs_by_state, leases_by_state;
- jobs_without_terminal_reason: a final job whose last event has no reason code, and every job
  not final at the end;
- lost_events: a job history that the state machine does not allow (a transition it forbids,
  an event missing between two: its `from` is not the last `to`, or the last `to` is not the
  job's state; an event that keeps the state is a note, not a transition), and each
  follower's events against what its tenant may see (missing, repeated or out of cursor order);
- double_runs: a job attempt that two nodes started, by the agents' start reports in the
  database or by the engine's container start/die events (by the control plane's labels).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter, defaultdict

import psycopg

from jobs.choices import JOB_TRANSITIONS, TERMINAL
from jobs.models import Job, JobEvent
from leases.choices import HOLDING
from leases.models import Lease, LeaseEvent
from nodes.models import GpuDevice, Node
from pools.models import Tenant
from scheduling.bench.scheduler import overcommitted

LABEL = "computepool"
STARTED = ("starting", "running")  # the agent's start reports
DETAILS = 20  # examples kept of each finding


def audit(
    database_url: str,
    *,
    control_plane_labels: dict,
    since: float,
    followers_seen: dict,
    engine_events: list | None = None,
) -> dict:
    with psycopg.connect(database_url, autocommit=True) as db:
        over = overcommitted_history(db)
        jobs = _rows(db, f"SELECT id, state, tenant_id FROM {_t(Job)}")
        events = _job_events(db)
        no_reason = jobs_without_terminal_reason(jobs, events)
        broken = broken_histories(jobs, events)
        followers = followers_missed(db, followers_seen)
        db_runs = double_starts(events)
        result = {
            "overcommitted_nodes": len(over),
            "jobs_by_state": _count(db, Job),
            "leases_by_state": _count(db, Lease),
            "jobs_without_terminal_reason": len(no_reason),
            "job_ends_by_reason": job_ends_by_reason(jobs, events),
            "lost_events": len(broken) + sum(f["lost"] for f in followers.values()),
            "details": {
                "overcommitted": sorted(over)[:DETAILS],
                "without_terminal_reason": no_reason[:DETAILS],
                "broken_histories": broken[:DETAILS],
                "followers": followers,
                "double_runs_reported": sorted(db_runs)[:DETAILS],
            },
        }
    engine_runs = engine_double_runs(control_plane_labels, since, events=engine_events)
    result["double_runs"] = len(db_runs | set(engine_runs["double"]))
    result["details"]["double_runs_engine"] = engine_runs
    return result


def _t(model) -> str:
    return model._meta.db_table


def _rows(db, query: str, params=()) -> list[tuple]:
    return db.execute(query, params).fetchall()


def _count(db, model) -> dict:
    return dict(_rows(db, f"SELECT state, count(*) FROM {_t(model)} GROUP BY state"))


def _job_events(db) -> dict[int, list[tuple]]:
    """Each job's events in id order: (id, from, to, reason, actor label)."""
    events = defaultdict(list)
    query = (
        f"SELECT job_id, id, from_state, to_state, reason, actor_label FROM {_t(JobEvent)} "
        "ORDER BY job_id, id"
    )
    for job_id, *event in _rows(db, query):
        events[job_id].append(tuple(event))
    return events


# --- capacity -----------------------------------------------------------------------------------


def overcommitted_history(db) -> set[int]:
    """The nodes that ever held more than their allocatable: each lease holds from the event
    that made it holding to the one that ended that; at every start, the leases holding on its
    node then are checked (a node can only go over when a lease begins)."""
    intervals = defaultdict(list)  # node → (start id, end id or None, lease row)
    leases = {
        row[0]: row[1:]
        for row in _rows(
            db,
            f"SELECT id, node_id, cpu_millicores, memory_mib, scratch_mib, gpu_allocations "
            f"FROM {_t(Lease)} WHERE backfill_of_id IS NULL AND node_id IS NOT NULL",
        )
    }
    holding = {}
    query = f"SELECT lease_id, id, to_state FROM {_t(LeaseEvent)} ORDER BY id"
    for lease_id, event_id, to_state in _rows(db, query):
        if lease_id not in leases:
            continue
        if to_state in HOLDING and lease_id not in holding:
            holding[lease_id] = event_id
        elif to_state not in HOLDING and lease_id in holding:
            intervals[leases[lease_id][0]].append((holding.pop(lease_id), event_id, lease_id))
    for lease_id, start in holding.items():
        intervals[leases[lease_id][0]].append((start, None, lease_id))
    allocatable = {
        node_id: tuple(limits)
        for node_id, *limits in _rows(
            db,
            f"SELECT id, cpu_millicores_allocatable, memory_mib_allocatable, "
            f"scratch_mib_allocatable FROM {_t(Node)}",
        )
    }
    gpu_nodes = dict(_rows(db, f"SELECT id, node_id FROM {_t(GpuDevice)}"))
    over = set()
    for _node_id, spans in intervals.items():
        for start, _, _ in spans:  # event ids order the moments
            rows = [
                leases[lease_id]
                for s, end, lease_id in spans
                if s <= start and (end is None or end > start)
            ]
            over |= overcommitted(rows, allocatable, gpu_nodes)
    return over


# --- jobs ---------------------------------------------------------------------------------------


def jobs_without_terminal_reason(jobs: list[tuple], events: dict) -> list[dict]:
    found = []
    for job_id, state, _ in jobs:
        history = events.get(job_id, [])
        if state not in TERMINAL:
            found.append({"job": job_id, "state": state, "why": "not final"})
        elif not history or not history[-1][3] or history[-1][2] != state:
            found.append({"job": job_id, "state": state, "why": "final event without a reason"})
    return found


def job_ends_by_reason(jobs: list[tuple], events: dict) -> dict[str, dict[str, int]]:
    """Final state → the reason code of the event that ended each job there → how many: what
    a failure was (a fault's casualty or a bug) is read here first."""
    ends = defaultdict(Counter)
    for job_id, state, _ in jobs:
        final = [e for e in events.get(job_id, []) if e[2] == state and e[1] != state]
        if state in TERMINAL and final:
            ends[state][final[-1][3] or "none"] += 1
    return {state: dict(reasons.most_common()) for state, reasons in sorted(ends.items())}


def broken_histories(jobs: list[tuple], events: dict) -> list[dict]:
    """Jobs whose events do not chain: the first from nothing to queued, each next one from the
    state the last one went to, either by a transition the job state machine allows or keeping
    the state, the last one to the job's state.

    An event that keeps the state is a note, not a transition: the product records some on
    purpose (`image_pulling`, `image_pulled`, `outputs_skipped`, `results_uploaded`,
    `artifacts_expired`, a preemptor's; docs/data-plane.md), and every change of state goes
    through the state machine's check against JOB_TRANSITIONS (pools.statemachine), where no
    state goes to itself. A second placement is no note: it comes from `queued` and shows here
    as an event from queued after leased."""
    broken = []
    for job_id, state, _ in jobs:
        previous, problem = "", None
        for event_id, from_state, to_state, _, _ in events.get(job_id, []):
            if from_state != previous:
                problem = f"event {event_id} from {from_state or '∅'} after {previous or '∅'}"
            elif previous == "" and to_state != "queued":
                problem = f"event {event_id}: the first goes to {to_state}"
            elif previous not in ("", to_state) and to_state not in JOB_TRANSITIONS.get(
                previous, ()
            ):
                problem = f"event {event_id}: {previous} → {to_state} is not allowed"
            if problem:
                break
            previous = to_state
        if problem is None and previous != state:
            problem = f"the last event goes to {previous or '∅'}, the job is {state}"
        if problem:
            broken.append({"job": job_id, "problem": problem})
    return broken


def followers_missed(db, followers_seen: dict) -> dict:
    """Per follower (by its tenant's slug): events of the tenant's jobs it never got, got
    twice, or got out of cursor order."""
    out = {}
    for slug, seen in followers_seen.items():
        expected = [
            row[0]
            for row in _rows(
                db,
                f"SELECT e.id FROM {_t(JobEvent)} e JOIN {_t(Job)} j ON j.id = e.job_id "
                f"JOIN {_t(Tenant)} t ON t.id = j.tenant_id WHERE t.slug = %s ORDER BY e.id",
                [slug],
            )
        ]
        cursors = [event["cursor"] for event in seen]
        repeats = sum(n - 1 for n in Counter(cursors).values() if n > 1)
        disorder = sum(1 for a, b in itertools.pairwise(cursors) if b < a)
        missing = sorted(set(expected) - set(cursors))
        foreign = sorted(set(cursors) - set(expected))  # another tenant's: never allowed
        out[slug] = {
            "expected": len(expected),
            "seen": len(cursors),
            "missing": missing[:DETAILS],
            "repeated": repeats,
            "out_of_order": disorder,
            "foreign": foreign[:DETAILS],
            "lost": len(missing) + repeats + disorder + len(foreign),
        }
    return out


# --- double runs --------------------------------------------------------------------------------


def double_starts(events: dict) -> set[tuple[int, int]]:
    """(job, attempt) whose attempt two nodes reported starting: an attempt begins at each
    placement (→ leased from another state; a note keeps it leased), its reports are the node
    actors' → starting / → running events."""
    found = set()
    for job_id, history in events.items():
        attempt, nodes = 0, set()
        for _, from_state, to_state, _, actor in history:
            if to_state == "leased" and from_state != "leased":
                attempt, nodes = attempt + 1, set()
            elif to_state in STARTED and actor.startswith("node:"):
                nodes.add(actor)
                if len(nodes) > 1:
                    found.add((job_id, attempt))
    return found


def _engine_filters(labels: dict) -> dict:
    return {
        "type": "container",
        "event": ["start", "die"],
        "label": [f"{k}={v}" for k, v in labels.items()] + [f"{LABEL}.job"],
    }


class EngineEvents:
    """The Docker engine's start and die events of the drill's job containers, watched live
    from before the load starts: the engine keeps only its last 256 events, so a query after
    the run would see only its tail."""

    def __init__(self, labels: dict):
        import docker

        self.client = docker.from_env()
        self.events: list[dict] = []
        self.stream = self.client.events(filters=_engine_filters(labels), decode=True)
        self.thread = threading.Thread(target=self._follow, daemon=True, name="engine-events")
        self.thread.start()

    def _follow(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends with an error when closed
            for event in self.stream:
                self.events.append(event)

    def stop(self) -> list[dict]:
        """The events seen; stops watching (again: nothing more)."""
        if self.thread.is_alive():
            time.sleep(1.0)  # the last die events of the settled jobs are on their way
            with contextlib.suppress(Exception):
                self.stream.close()
            self.thread.join(timeout=5)
            self.client.close()
        return list(self.events)


def engine_double_runs(
    labels: dict, since: float, until: float | None = None, events: list | None = None
) -> dict:
    """From the Docker engine's own events (those watched live, else the engine's own recent
    history): the containers of each (job, attempt), by node, each running from its start to
    its die (or still). Two nodes' overlapping: a double run."""
    runs = defaultdict(list)  # (job, attempt) → [node, container, start, end]
    open_runs = {}
    client = None
    if events is None:
        import docker

        client = docker.from_env()
        until = until or time.time()
        events = client.events(
            since=int(since), until=int(until) + 1, filters=_engine_filters(labels), decode=True
        )
    try:
        for event in events:
            attributes = event.get("Actor", {}).get("Attributes", {})
            at = event.get("timeNano", 0) / 1e9
            container = event.get("id") or event.get("Actor", {}).get("ID")
            if event.get("status", event.get("Action")) == "start":
                key = (int(attributes[f"{LABEL}.job"]), int(attributes.get(f"{LABEL}.attempt", 1)))
                run = [attributes.get(f"{LABEL}.node_id"), container, at, None]
                runs[key].append(run)
                open_runs[container] = run
            elif container in open_runs:
                open_runs.pop(container)[3] = at
    finally:
        if client is not None:
            client.close()
    double = []
    for key, spans in runs.items():
        for i, (node_a, _, start_a, end_a) in enumerate(spans):
            for node_b, _, start_b, end_b in spans[i + 1 :]:
                if node_a != node_b and _overlap(start_a, end_a, start_b, end_b):
                    double.append(key)
    return {
        "containers_started": sum(len(spans) for spans in runs.values()),
        "double": sorted(set(double)),
    }


def _overlap(a0, a1, b0, b1) -> bool:
    return a0 < (b1 if b1 is not None else float("inf")) and b0 < (
        a1 if a1 is not None else float("inf")
    )


# --- recovery -----------------------------------------------------------------------------------


def recovery(faults, database_url: str, load) -> list[dict]:
    """Per fault (in order): seconds from its end to the next lease created (a placement),
    and to the API answering within the run's p99 again (five 2xx answers in a row, each
    within it). None: it never did before the run ended."""
    samples = sorted(load.samples())
    latencies = sorted(latency for _, latency, _ in samples)
    run_p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if samples else None
    out = []
    with psycopg.connect(database_url, autocommit=True) as db:
        for fault in faults:
            name, end = _field(fault, "name"), _field(fault, "ended_at")
            placed = db.execute(
                f"SELECT min(extract(epoch FROM at))::float FROM {_t(LeaseEvent)} "
                "WHERE from_state = '' AND at >= to_timestamp(%s)",
                [end],
            ).fetchone()[0]
            out.append(
                {
                    "name": name,
                    "to_next_placement_s": _round(placed - end if placed else None),
                    "to_p99_s": _round(_back_within(samples, end, run_p99)),
                }
            )
    return out


def _back_within(samples, end: float, limit: float | None, streak: int = 5) -> float | None:
    if limit is None:
        return None
    run = []
    for at, latency, outcome in samples:
        if at < end:
            continue
        if outcome == "2xx" and latency <= limit:
            run.append(at)
            if len(run) == streak:
                return run[0] - end
        else:
            run = []
    return None


def _field(fault, name: str):
    return fault[name] if isinstance(fault, dict) else getattr(fault, name)


def _round(value):
    return None if value is None else round(float(value), 2)
