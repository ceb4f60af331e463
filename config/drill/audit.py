"""The drill's verdict, read from what it left: the drill's own database (psycopg, directly) and
the Docker engine's own events, never from what the control plane says of itself.

- overcommitted_nodes: at every moment a lease began to hold, what the holding leases of its
  node held against the node's allocatable (scheduling.bench.scheduler.overcommitted, the
  bench's own check, over the leases' history); a backfill counts inside its reservation while
  that is reserved, on its own once the reservation was claimed or ended, and a node where a
  backfill's container ran beside its reservation's job's container counts too;
- jobs_by_state, leases_by_state;
- jobs_without_terminal_reason: a final job whose last event has no reason code, and every job
  not final at the end;
- lost_events: a job history that the state machine does not allow (a transition it forbids,
  an event missing between two: its `from` is not the last `to`, or the last `to` is not the
  job's state; an event that keeps the state is a note, not a transition), and each
  follower's events against what its tenant may see (missing, repeated or out of cursor order);
- double_runs: jobs that ran twice at once: an attempt that two nodes reported starting (the
  agents' reports in the database), or two containers of one job, any attempt, any node, whose
  runs overlap by the engine's container start/die events (by the control plane's labels);
  None when the engine watch broke (it cannot say 0);
- runs_unseen_by_engine: jobs that ran (a node reported them running, or they succeeded) of
  which the engine watch saw no container: a label that did not match would hide every double
  run.
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
from leases.choices import HOLDING, LeaseState
from leases.models import Lease, LeaseEvent
from nodes.models import GpuDevice, Node
from pools.models import Tenant
from pools.reasons import Reason
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
    engine_error: str | None = None,
) -> dict:
    """`engine_events`: the engine's events watched live (EngineEvents; None: the engine's own
    recent history is read); `engine_error`: why that watch broke, if it did."""
    if engine_events is None:
        engine_events = engine_history(control_plane_labels, since)
    spans = engine_spans(engine_events)
    engine_runs = double_runs_of(spans)
    with psycopg.connect(database_url, autocommit=True) as db:
        over = overcommitted_history(db)
        lent = backfills_beside_their_reservation(db, spans)
        jobs = _rows(db, f"SELECT id, state, tenant_id FROM {_t(Job)}")
        events = _job_events(db)
        no_reason = jobs_without_terminal_reason(jobs, events)
        broken = broken_histories(jobs, events)
        followers = followers_missed(db, followers_seen)
        db_runs = double_starts(events)
        unseen = sorted(jobs_that_ran(jobs, events) - {span["job"] for span in spans})
        result = {
            "overcommitted_nodes": len(over | {entry["node"] for entry in lent}),
            "jobs_by_state": _count(db, Job),
            "leases_by_state": _count(db, Lease),
            "jobs_without_terminal_reason": len(no_reason),
            "job_ends_by_reason": job_ends_by_reason(jobs, events),
            "lost_events": len(broken) + sum(f["lost"] for f in followers.values()),
            "details": {
                "overcommitted": sorted(over)[:DETAILS],
                "backfills_beside_their_reservation": lent[:DETAILS],
                "without_terminal_reason": no_reason[:DETAILS],
                "broken_histories": broken[:DETAILS],
                "followers": followers,
                "double_runs_reported": sorted(db_runs)[:DETAILS],
            },
        }
    # by job: an attempt two nodes reported starting, or two containers of one job at once
    doubled = {job for job, _ in db_runs} | set(engine_runs["double"])
    result["double_runs"] = None if engine_error else len(doubled)
    result["runs_unseen_by_engine"] = len(unseen)
    result["details"]["double_runs_engine"] = engine_runs | {
        "unseen": unseen[:DETAILS],
        "watch_error": engine_error,
    }
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
    node then are checked (a node can only go over when a lease begins to count).

    A backfill (`backfill_of`) holds nothing on the ledger of its own: it runs on capacity its
    reservation holds, and counting both would count that capacity twice. So while its
    reservation is `reserved` (holding, unclaimed) the backfills inside it count as part of it
    (the reservation then holds, per resource, the larger of itself and its live backfills'
    sum: backfills lent beyond it count too). Once the reservation is claimed (its job starts:
    `committed`) or ends, the product expires its backfills in the same transaction
    (leases.services.lifecycle._close_backfills, the same `at`); a backfill that still holds
    after that moment holds capacity nothing else counts (the reservation's job runs on it),
    and counts on its own from then — as one its reservation's early end left running does
    (leases.services.lifecycle._adopt_backfills: the ledger moves its part onto it)."""
    leases = {
        row[0]: row[1:]
        for row in _rows(
            db,
            f"SELECT id, node_id, cpu_millicores, memory_mib, scratch_mib, gpu_allocations, "
            f"backfill_of_id FROM {_t(Lease)} WHERE node_id IS NOT NULL",
        )
    }
    # a backfill left running when its reservation ended has no `backfill_of` any more: its
    # `backfill_adopted` event names the reservation it ran inside until then
    adopted = f"SELECT lease_id, data->>'backfill_of' FROM {_t(LeaseEvent)} WHERE reason = %s"
    for lease_id, parent in _rows(db, adopted, (Reason.BACKFILL_ADOPTED.value,)):
        if lease_id in leases:
            leases[lease_id] = (*leases[lease_id][:5], int(parent))
    parents = {row[5] for row in leases.values() if row[5] is not None}
    holds: dict[int, list] = {}  # lease → [start id, end id or None, end at or None]
    claimed: dict[int, tuple] = {}  # reservation → (id, at) of its event out of `reserved`
    query = f"SELECT lease_id, id, to_state, at FROM {_t(LeaseEvent)} ORDER BY id"
    for lease_id, event_id, to_state, at in _rows(db, query):
        if lease_id not in leases:
            continue
        left = to_state != LeaseState.RESERVED  # claimed (committed) or ended
        if left and lease_id in parents and lease_id in holds and lease_id not in claimed:
            claimed[lease_id] = (event_id, at)
        if to_state in HOLDING and lease_id not in holds:
            holds[lease_id] = [event_id, None, None]
        elif to_state not in HOLDING and lease_id in holds and holds[lease_id][1] is None:
            holds[lease_id][1:] = [event_id, at]
    spans = defaultdict(list)  # node → (start id, end id or None, lease, reservation inside)
    for lease_id, (start, end, end_at) in holds.items():
        node, parent = leases[lease_id][0], leases[lease_id][5]
        if parent is None or parent not in holds:
            spans[node].append((start, end, lease_id, None))
            continue
        cut = claimed.get(parent)
        if cut is None or (end is not None and (end < cut[0] or end_at <= cut[1])):
            spans[node].append((start, end, lease_id, parent))  # inside it while it held
        elif start >= cut[0]:
            spans[node].append((start, end, lease_id, None))
        else:  # held on past its reservation's claim or end: on its own from then
            spans[node].append((start, cut[0], lease_id, parent))
            spans[node].append((cut[0], end, lease_id, None))
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
    for node_id, node_spans in spans.items():
        for moment in sorted({start for start, _, _, _ in node_spans}):  # event ids order them
            own, inside = {}, defaultdict(list)
            for start, end, lease_id, parent in node_spans:
                if start <= moment and (end is None or end > moment):
                    if parent is None:
                        own[lease_id] = leases[lease_id][:5]
                    else:
                        inside[parent].append(leases[lease_id][:5])
            for parent, children in inside.items():
                if parent in own:
                    own[parent] = _with_backfills(own[parent], children)
                else:  # not holding itself: what runs in it counts as it is
                    for n, child in enumerate(children):
                        own[("backfill", parent, n)] = child
            if over_now := overcommitted(list(own.values()), allocatable, gpu_nodes):
                over |= over_now
                if node_id in over:
                    break
    return over


def _with_backfills(parent: tuple, children: list[tuple]) -> tuple:
    """A reservation's row holding, per resource, the larger of itself and its backfills'
    sum; on each GPU, the backfills' milli beyond its own as a share of its own."""
    node, cpu, memory, scratch, allocations = parent
    lent = Counter()
    for child in children:
        for alloc in child[4]:
            lent[alloc["gpu"]] += alloc.get("milli", 0)
    held = Counter()
    for alloc in allocations:
        if not alloc.get("mig_slots"):
            held[alloc["gpu"]] += alloc.get("milli", 0)
    beyond = [{"gpu": g, "milli": m - held[g]} for g, m in lent.items() if m > held[g]]
    return (
        node,
        max(cpu, sum(child[1] for child in children)),
        max(memory, sum(child[2] for child in children)),
        max(scratch, sum(child[3] for child in children)),
        list(allocations) + beyond,
    )


def backfills_beside_their_reservation(db, spans: list[dict]) -> list[dict]:
    """Backfills whose container ran (by the engine's events) while a container of their
    reservation's own job ran: the capacity the reservation holds once was used twice at
    once, whatever the leases' history says (a backfill's lease expires when its reservation
    is claimed, its container stops after)."""
    lent = dict(
        _rows(db, f"SELECT id, backfill_of_id FROM {_t(Lease)} WHERE backfill_of_id IS NOT NULL")
    )
    if not lent:
        return []
    by_lease = defaultdict(list)
    for span in spans:
        by_lease[span["lease"]].append(span)
    found = []
    for child, parent in sorted(lent.items()):
        for a, b in itertools.product(by_lease.get(child, ()), by_lease.get(parent, ())):
            if _overlap(a["start"], a["end"], b["start"], b["end"]):
                node = _int(a["node"])
                found.append({"backfill": child, "reservation": parent, "node": node})
                break
    return found


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
    the run would see only its tail. `error`: why the watch broke before `stop` (the stream
    failed or ended): what it saw then is not the whole run, and cannot vouch for a 0."""

    def __init__(self, labels: dict):
        import docker

        self.client = docker.from_env()
        self.events: list[dict] = []
        self.error: str | None = None
        self._stopping = threading.Event()
        self.stream = self.client.events(filters=_engine_filters(labels), decode=True)
        self.thread = threading.Thread(target=self._follow, daemon=True, name="engine-events")
        self.thread.start()

    def _follow(self) -> None:
        try:
            for event in self.stream:
                self.events.append(event)
        except Exception as exc:  # closing the stream ends it with an error: that one is ours
            if not self._stopping.is_set():
                self.error = f"{type(exc).__name__}: {exc}"
            return
        if not self._stopping.is_set():
            self.error = "the engine ended the event stream"

    def stop(self) -> list[dict]:
        """The events seen; stops watching (again: nothing more)."""
        if self.thread.is_alive():
            time.sleep(1.0)  # the last die events of the settled jobs are on their way
            self._stopping.set()
            with contextlib.suppress(Exception):
                self.stream.close()
            self.thread.join(timeout=5)
            with contextlib.suppress(Exception):
                self.client.close()
        self._stopping.set()
        return list(self.events)


def engine_history(labels: dict, since: float, until: float | None = None) -> list[dict]:
    """The engine's own recent events of the labelled job containers (its last 256 only)."""
    import docker

    client = docker.from_env()
    try:
        until = until or time.time()
        return list(
            client.events(
                since=int(since), until=int(until) + 1, filters=_engine_filters(labels), decode=True
            )
        )
    finally:
        client.close()


def engine_spans(events) -> list[dict]:
    """Each job container's run, by the engine's events: its job, attempt, lease and node (its
    labels), from its start to its die (end None: still running when the events end)."""
    spans, running = [], {}
    for event in events:
        actor = event.get("Actor", {})
        attributes = actor.get("Attributes", {})
        at = event.get("timeNano", 0) / 1e9
        container = event.get("id") or actor.get("ID")
        if event.get("status", event.get("Action")) == "start":
            if container in running:
                continue  # started again while running: the same run
            span = {
                "job": _int(attributes.get(f"{LABEL}.job")),
                "attempt": _int(attributes.get(f"{LABEL}.attempt")) or 1,
                "lease": _int(attributes.get(f"{LABEL}.lease")),
                "node": attributes.get(f"{LABEL}.node_id"),
                "container": (container or "")[:12],
                "start": at,
                "end": None,
            }
            spans.append(span)
            running[container] = span
        elif container in running:
            running.pop(container)["end"] = at
    return spans


def double_runs_of(spans: list[dict]) -> dict:
    """Jobs two of whose containers ran at overlapping times: any attempts, any nodes (an old
    attempt still running on a cut-off node beside the next one elsewhere, two on one node)."""
    by_job = defaultdict(list)
    for span in spans:
        by_job[span["job"]].append(span)
    overlaps = []
    for job, runs in by_job.items():
        for a, b in itertools.combinations(runs, 2):
            if _overlap(a["start"], a["end"], b["start"], b["end"]):
                overlaps.append(
                    {
                        "job": job,
                        "runs": [
                            {k: run[k] for k in ("attempt", "node", "lease", "container")}
                            for run in (a, b)
                        ],
                    }
                )
    return {
        "containers_started": len(spans),
        "double": sorted({overlap["job"] for overlap in overlaps}, key=lambda j: (j is None, j)),
        "overlaps": overlaps[:DETAILS],
    }


def engine_double_runs(
    labels: dict, since: float, until: float | None = None, events: list | None = None
) -> dict:
    """From the Docker engine's own events (those watched live, else the engine's own recent
    history): the jobs two of whose containers ran at once (double_runs_of)."""
    if events is None:
        events = engine_history(labels, since, until)
    return double_runs_of(engine_spans(events))


def jobs_that_ran(jobs: list[tuple], events: dict) -> set[int]:
    """Jobs a node reported running, and jobs that succeeded: each had a container."""
    ran = {job_id for job_id, state, _ in jobs if state == "succeeded"}
    for job_id, history in events.items():
        if any(e[2] == "running" and e[4].startswith("node:") for e in history):
            ran.add(job_id)
    return ran


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _overlap(a0, a1, b0, b1) -> bool:
    return a0 < (b1 if b1 is not None else float("inf")) and b0 < (
        a1 if a1 is not None else float("inf")
    )


# --- recovery -----------------------------------------------------------------------------------


def recovery(faults, database_url: str, load) -> list[dict]:
    """Per fault (in order), from its end: `to_next_placement_s`, seconds to the next job a
    scheduling pass placed (a job's queued → leased `placed` event; a lease reserved through
    the lease API is no placement); `to_p99_s`, seconds to the API answering within the
    baseline p99 again (the load's p99 before the first fault: five 2xx answers in a row, each
    within it). None: it never did before the run ended (or there was no baseline)."""
    samples = sorted(load.samples())
    first = min((_field(fault, "started_at") for fault in faults), default=None)
    before = [latency for at, latency, _ in samples if first is None or at <= first]
    baseline = sorted(before)[min(len(before) - 1, int(0.99 * len(before)))] if before else None
    out = []
    with psycopg.connect(database_url, autocommit=True) as db:
        for fault in faults:
            name, end = _field(fault, "name"), _field(fault, "ended_at")
            placed = db.execute(
                f"SELECT min(extract(epoch FROM at))::float FROM {_t(JobEvent)} "
                "WHERE to_state = 'leased' AND from_state = 'queued' AND reason = 'placed' "
                "AND at >= to_timestamp(%s)",
                [end],
            ).fetchone()[0]
            out.append(
                {
                    "name": name,
                    "to_next_placement_s": _round(placed - end if placed else None),
                    "to_p99_s": _round(_back_within(samples, end, baseline)),
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
