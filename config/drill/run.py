"""The drill's timeline (issue 25): start the fleet (cluster.py), start the load (load.py), inject
the faults one after another with settle gaps while the load runs, then a burst of hostile
requests; stop the load, wait for the jobs to settle, audit the database and the engines
(audit.py) and say how long each fault took to recover from. One dict comes back; `ok` is
whether `failures` finds nothing: every count that must be zero is zero, every planned fault
ran and found what it promises, the hostile burst was refused whole, no process crashed and the
fleet left nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from config.drill.cluster import Cluster
from config.drill.faults import FAULTS, inject

# What must be zero after any drill (issue 25), and the jobs that ran without a container the
# engine watch saw: its double runs would be unseen too (a label that did not match, a watch
# that saw nothing)
ZEROS = (
    "overcommitted_nodes",
    "jobs_without_terminal_reason",
    "lost_events",
    "double_runs",
    "runs_unseen_by_engine",
)


@dataclass(frozen=True)
class Profile:
    faults: tuple[str, ...]
    params: dict = field(default_factory=dict)  # fault → its keyword arguments
    warmup_s: float = 20  # the load alone before the first fault
    settle_s: float = 15  # between two faults
    settle_timeout_s: float = 240  # for every submitted job to end, after the load stops
    heartbeat_s: int = 2
    beat_lock_s: int = 10
    agents: int = 3


PROFILES = {
    # every fault of the issue, at its length
    "full": Profile(
        faults=tuple(FAULTS),
        params={
            "agent_partition": {"seconds": 30},
            "second_beat": {"seconds": 20},
            "redis_cut": {"seconds": 20},
        },
    ),
    # the test suite's: one fault of each part (agent, worker, each store, web), short
    # timeouts, the whole run under 4 minutes on 2 cores
    "bounded": Profile(
        faults=(
            "agent_kill",
            "worker_kill_mid_pass",
            "postgres_restart",
            "redis_restart",
            "web_kill",
        ),
        params={
            "agent_kill": {"find_s": 15},
            "worker_kill_mid_pass": {"find_s": 10, "down_s": 1},
            "web_kill": {"down_s": 2},
        },
        warmup_s=8,
        settle_s=5,
        settle_timeout_s=60,
        beat_lock_s=5,
    ),
}


def _say(message: str) -> None:
    print(f"drill {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


def run_drill(
    *,
    profile: str = "full",
    faults: list[str] | None = None,
    seconds: float | None = None,
    keep: bool = False,
    workdir: Path | None = None,
    say=_say,
    on_started=None,
) -> dict:
    """The drill, start to end; the cluster is stopped whatever happens. `on_started(cluster)`
    runs once the fleet is ready, before the load (the suite looks at the fleet there)."""
    # imported here: helper C's modules (the load, the audit) are their own
    from config.drill.audit import EngineEvents, audit, recovery
    from config.drill.load import Load, hostile_burst

    chosen = PROFILES[profile]
    names = list(faults) if faults is not None else list(chosen.faults)
    started = time.time()
    cluster = Cluster(
        workdir=workdir,
        agents_count=chosen.agents,
        heartbeat_s=chosen.heartbeat_s,
        beat_lock_s=chosen.beat_lock_s,
        keep=keep,
    )
    load = engine = None
    result: dict = {"profile": profile, "faults_planned": names}
    try:
        say(f"starting the fleet in {cluster.dir}")
        cluster.start()
        result["fleet_started_s"] = round(time.time() - started, 1)
        if on_started is not None:
            on_started(cluster)
        say(f"fleet ready in {result['fleet_started_s']} s at {cluster.api_url}; load starts")
        engine = EngineEvents(cluster.control_plane_labels)  # before the first job starts
        load_started = time.time()
        load = Load(cluster.api_url, cluster.ca_file, cluster.tokens, pool=cluster.pool)
        load.start()
        time.sleep(chosen.warmup_s)
        # with --seconds the faults are spread over that long a run
        gap = chosen.settle_s
        if seconds:
            gap = max(gap, (seconds - chosen.warmup_s) / max(1, len(names)))
        records = []
        for name in names:
            began = time.monotonic()
            say(f"fault {name}")
            record = inject(cluster, name, **chosen.params.get(name, {}))
            records.append(record)
            say(f"fault {name} done: {record.detail}")
            time.sleep(max(0.0, gap - (time.monotonic() - began)) if seconds else gap)
        say("hostile burst")
        target = next((a.node_id for a in cluster.agents if a.node_id), None)
        hostile = hostile_burst(cluster.api_url, cluster.ca_file, cluster.tokens, node_id=target)
        load.stop()
        load_ended = time.time()
        say("load stopped; waiting for the jobs to settle")
        settled = load.wait_settled(chosen.settle_timeout_s)
        report = load.report()
        say("audit")
        engine_events = engine.stop()
        audited = audit(
            cluster.database_url,
            control_plane_labels=cluster.control_plane_labels,
            since=load_started,
            followers_seen=getattr(load, "followers_seen", {}),
            engine_events=engine_events,
            engine_error=engine.error,
        )
        recovered = recovery(records, cluster.database_url, load)
        result |= {
            **report,  # requests by outcome, …
            "load_s": round(load_ended - load_started, 1),
            "settled": settled,
            # p99 while the load ran (the report's own also counts the settle phase's reads)
            "p99_s": load.p99_between(load_started, load_ended),
            # the load alone, before the first fault: what each fault's `to_p99_s` is back to
            "p99_baseline_s": load.p99_between(
                load_started, records[0].started_at if records else load_ended
            ),
            "hostile": hostile,
            **audited,
            "faults": [
                record.to_dict()
                | {"p99_during_s": load.p99_between(record.started_at, _window_end(record))}
                | _recovered(recovered, record.name, index)
                | {"judged": judge_fault(record.to_dict())}
                for index, record in enumerate(records)
            ],
        }
    except Exception as exc:  # reported in the JSON (and failing it), never lost with the logs
        result["error"] = f"{type(exc).__name__}: {exc}"
        say(f"error: {result['error']}; the logs' tails follow")
        cluster.say_logs(sys.stderr, lines=15)
    finally:
        _ignore_interrupts()  # a second Ctrl-C must not cut the clean-up short
        if engine is not None:
            engine.stop()
        if load is not None:
            try:
                load.stop()
            except Exception as exc:
                say(f"the load did not stop cleanly: {exc}")
        say("stopping the fleet")
        problems = cluster.stop()
        # processes that exited on their own (not by a fault), restarted by the drill's
        # supervisor as systemd's Restart= would: each is a crash worth reading in its log
        result["unexpected_exits"] = cluster.exits
        result["leftovers"] = problems + cluster.leftovers()
        result["workdir"] = str(cluster.dir) if keep else None
        result["wall_s"] = round(time.time() - started, 1)
    result["ok"] = verdict(result)
    return result


# A fault shorter than this (a restart of a second) is measured over this long from its start:
# its effect outlasts it, and a window of a few requests has no p99.
MIN_FAULT_WINDOW_S = 5.0


def _window_end(record) -> float:
    return max(record.ended_at, record.started_at + MIN_FAULT_WINDOW_S)


def _ignore_interrupts() -> None:
    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _recovered(recovered, name: str, index: int) -> dict:
    """The audit's recovery figures of the fault (by position in a list, or by name)."""
    if isinstance(recovered, list) and index < len(recovered):
        return dict(recovered[index])
    if isinstance(recovered, dict):
        found = recovered.get(name)
        return dict(found) if isinstance(found, dict) else {}
    return {}


def failures(result: dict) -> list[str]:
    """Why the drill failed (empty: it passed): a count that must be zero is not, the run or a
    fault broke, a fault found the product wrong, the hostile burst got anything but 4xx (or
    skipped a probe), a process crashed, the fleet left something, or nothing succeeded."""
    found = [f"{name} = {result.get(name)!r}" for name in ZEROS if result.get(name) != 0]
    if result.get("error"):
        found.insert(0, result["error"])
    watch = result.get("details", {}).get("double_runs_engine", {})
    if watch.get("watch_error"):
        found.append(f"the engine's event watch broke: {watch['watch_error']}")
    planned = list(result.get("faults_planned", ()))
    faults = list(result.get("faults", ()))
    if not result.get("error"):
        if not planned:
            found.append("no fault was planned: the drill broke nothing")
        if [fault.get("name") for fault in faults] != planned:
            found.append(
                f"{len(faults)} fault records for {len(planned)} faults planned: "
                f"{[fault.get('name') for fault in faults]} != {planned}"
            )
    for fault in faults:
        if fault.get("detail", {}).get("error"):
            found.append(f"fault {fault['name']}: {fault['detail']['error']}")
        else:
            found += [f"fault {fault['name']}: {why}" for why in judge_fault(fault)["failed"]]
    found += _hostile_failures(result)
    if result.get("unexpected_exits"):
        exits = [f"{e.get('name')} ({e.get('returncode')})" for e in result["unexpected_exits"]]
        found.append(f"processes exited on their own: {', '.join(exits)}")
    if result.get("leftovers"):
        found.append(f"left behind: {result['leftovers']}")
    if not result.get("error") and not result.get("jobs_by_state", {}).get("succeeded"):
        found.append("no job succeeded: the drill proved nothing")  # a fleet that did nothing
    return found


def _hostile_failures(result: dict) -> list[str]:
    if "hostile" not in result:
        return [] if result.get("error") else ["no hostile burst was sent"]
    hostile = result["hostile"] or {}
    found = []
    accepted = [
        label
        for entry in hostile.values()
        if isinstance(entry, dict)
        for label in entry.get("accepted", ())
    ]
    if hostile.get("not_4xx") or accepted:
        found.append(
            f"the hostile burst got {hostile.get('not_4xx', len(accepted))} answers other than "
            f"4xx: {accepted[:5]}"
        )
    if hostile.get("skipped"):
        found.append(f"the hostile burst skipped probes: {hostile['skipped'][:5]}")
    if not hostile.get("requests"):
        found.append("the hostile burst sent nothing")
    return found


def judge_fault(fault: dict) -> dict:
    """What a fault's record says of the product: `failed`, the reasons it broke a promise (an
    agent never back, a second beat that led, a lock never released, leases never held
    uncertain); `reached`, whether the fault hit the moment that makes it hurt (an agent
    running jobs, a pass holding its lock), with `note` saying what it did instead. A fault
    that missed its moment proves less but is no failure of the product."""
    name, detail = fault.get("name"), fault.get("detail") or {}
    if detail.get("error"):  # failures() reports it as it is
        return {"failed": [], "reached": False, "note": "it could not be done"}
    failed, reached, note = [], True, ""
    agent = detail.get("agent", "the agent")
    if name in ("agent_kill", "agent_freeze", "agent_partition"):
        if not detail.get("running_jobs"):
            reached, note = False, f"{agent} ran no job when it was hit"
        if "back_after_s" in detail and detail["back_after_s"] is None:
            failed.append(f"{agent}'s node was never ready and reachable again")
    if name == "agent_freeze" and not detail.get("went_uncertain"):
        # frozen with jobs, the control plane holds their leases uncertain; without, it marks
        # the node unreachable (`went_uncertain` says whether the one expected came)
        expected = detail.get("expected") or (
            "uncertain" if detail.get("running_jobs") else "unreachable"
        )
        what = "its leases were never held uncertain"
        if expected != "uncertain":
            what = "its node never went unreachable"
        failed.append(f"{agent} frozen {detail.get('frozen_s')} s: {what}")
    if name == "agent_partition" and not detail.get("went_unreachable"):
        if detail.get("unreachable_expected", True):
            failed.append(
                f"{agent} cut off {detail.get('seconds')} s: its node never went unreachable"
            )
        else:
            reached = False
            note = f"a cut of {detail.get('seconds')} s is too short to be noticed"
    if name == "worker_kill_mid_pass":
        if not detail.get("pass_caught"):
            reached = False
            note = f"no pass caught holding its lock: {detail.get('worker')} killed idle"
        elif not detail.get("lock_released"):
            failed.append(f"the pass lock of the killed {detail.get('worker')} was never released")
    if name == "second_beat":
        if detail.get("second_led"):
            failed.append("the second beat led (sent tasks) beside the first one")
        if detail.get("exited_by_itself") is not None:
            failed.append(
                f"the second beat exited by itself ({detail['exited_by_itself']}): a crash"
            )
        if not detail.get("second_led") and not detail.get("second_stood_by"):
            reached = False
            note = "the second beat never came to the leader lock"
    return {"failed": failed, "reached": reached, "note": note}


def verdict(result: dict) -> bool:
    return not failures(result)
