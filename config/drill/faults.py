"""The drill's faults (issue 25): each does its fault to a running Cluster, undoes it, and
returns a FaultRecord — when it began and ended (time.time()) and what it found and did. The
end is when the fault was undone (the process restarted, the link up again): recovery is
measured from there.

Each waits, within a bound, for the moment that makes the fault hurt (an agent running a job,
a pass holding its pool's lock) and says in `detail` whether it found it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field

from config.drill.cluster import Agent, Cluster, run

# scheduling/coalesce.py LOCK_SPACE: the first key of a pool pass's advisory lock (not imported:
# this module runs in the drill's process, whose Django speaks to another database)
PASS_LOCK_SPACE = 0x50415353


@dataclass
class FaultRecord:
    name: str
    started_at: float
    ended_at: float
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# after SIGSTOP, before reading what the frozen agent's node holds: its last requests land
FROZEN_LOOK_S = 0.5
# nodes/conf.py NODE_MISSED_HEARTBEATS and config/celery.py's nodes-heartbeat-sweep (s)
MISSED_HEARTBEATS = 3
HEARTBEAT_SWEEP_S = 10.0
NOTICE_MARGIN_S = 5.0


def unreachable_within(cluster) -> float:
    """How long an agent must be silent for the control plane to mark its node unreachable
    for sure: its missed heartbeats, the sweep's period, a margin for a loaded machine."""
    heartbeat = getattr(cluster, "heartbeat_s", 2)
    return MISSED_HEARTBEATS * heartbeat + HEARTBEAT_SWEEP_S + NOTICE_MARGIN_S


def _record(name: str, started: float, **detail) -> FaultRecord:
    return FaultRecord(name=name, started_at=started, ended_at=time.time(), detail=detail)


def _poll(check, timeout: float, every: float = 0.2):
    """check() until it returns something true, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    return None


def _query(cluster: Cluster, sql: str, params=()) -> list:
    """Rows of `sql` on the drill's database; [] while it does not answer (a fault may have
    stopped it)."""
    try:
        with cluster.connect() as conn:
            return conn.execute(sql, params).fetchall()
    except Exception:
        return []


def committed_jobs_by_node(cluster: Cluster) -> dict[int, int]:
    rows = _query(
        cluster,
        "SELECT node_id, count(*) FROM scheduling_lease WHERE pool_id = %s AND state = "
        "'committed' AND job_id IS NOT NULL GROUP BY node_id",
        [cluster.pool_id],
    )
    return dict(rows)


def _busy_agent(cluster: Cluster, timeout: float) -> tuple[Agent, int]:
    """The agent with the most committed job leases (waiting up to `timeout` for one to have
    any); the first agent and 0 when none ran anything in time."""

    def find():
        busy = committed_jobs_by_node(cluster)
        ranked = sorted(cluster.agents, key=lambda a: -busy.get(a.node_id, 0))
        if ranked and busy.get(ranked[0].node_id):
            return ranked[0], busy[ranked[0].node_id]
        return None

    return _poll(find, timeout, every=0.5) or (cluster.agents[0], 0)


def _node(cluster: Cluster, agent: Agent) -> tuple | None:
    """(state, reachability, last heartbeat as epoch seconds) of the agent's node."""
    rows = _query(
        cluster,
        "SELECT state, reachability, extract(epoch FROM last_heartbeat_at) FROM nodes_node "
        "WHERE id = %s",
        [agent.node_id],
    )
    return tuple(rows[0]) if rows else None


def _wait_back(cluster: Cluster, agent: Agent, since: float, timeout: float) -> float | None:
    """Seconds from `since` until the agent's node is ready, reachable and has sent a heartbeat
    after `since` (None: not within `timeout`)."""

    def back():
        node = _node(cluster, agent)
        return node and node[:2] == ("ready", "reachable") and float(node[2] or 0) > since

    ok = _poll(back, timeout, every=0.5)
    return round(time.time() - since, 2) if ok else None


# --- agents -----------------------------------------------------------------------------------
def agent_kill(cluster: Cluster, *, find_s: float = 30, down_s: float = 2, **_) -> FaultRecord:
    """An agent SIGKILLed while it runs jobs; restarted with its state dir (its credential and
    key), it adopts or ends what it left running."""
    agent, running = _busy_agent(cluster, find_s)
    started = time.time()
    with cluster.hold(agent.name):
        cluster.kill(agent.name, signal.SIGKILL)
        time.sleep(down_s)
        cluster.start_agent(agent, enroll=False)
    back = _wait_back(cluster, agent, time.time(), timeout=60)
    return _record("agent_kill", started, agent=agent.name, running_jobs=running, back_after_s=back)


def agent_freeze(
    cluster: Cluster, *, find_s: float = 30, timeout_s: float = 60, **_
) -> FaultRecord:
    """An agent frozen (SIGSTOP) until the control plane holds its leases uncertain (its node
    unreachable when it had none), then resumed (SIGCONT). `expected` says which: what the
    node held once the agent was frozen (its jobs may have ended between the look and the
    signal), and `went_uncertain` whether it came within `timeout_s`."""
    agent, running = _busy_agent(cluster, find_s)
    started = time.time()
    cluster.kill(agent.name, signal.SIGSTOP)
    time.sleep(FROZEN_LOOK_S)  # what the agent sent before the signal has landed
    committed = committed_jobs_by_node(cluster).get(agent.node_id, 0)

    def uncertain():
        if committed:
            rows = _query(
                cluster,
                "SELECT count(*) FROM scheduling_lease WHERE node_id = %s AND state = 'uncertain'",
                [agent.node_id],
            )
            return rows[0][0] if rows and rows[0][0] else None
        node = _node(cluster, agent)
        return node is not None and node[1] == "unreachable"

    try:
        seen = _poll(uncertain, timeout_s, every=0.5)
        frozen_s = round(time.time() - started, 2)
    finally:
        cluster.kill(agent.name, signal.SIGCONT)
    back = _wait_back(cluster, agent, time.time(), timeout=60)
    return _record(
        "agent_freeze",
        started,
        agent=agent.name,
        running_jobs=running,
        committed_when_frozen=committed,
        expected="uncertain" if committed else "unreachable",
        uncertain_leases=seen if committed else 0,
        went_uncertain=bool(seen),
        frozen_s=frozen_s,
        back_after_s=back,
    )


def agent_partition(cluster: Cluster, *, seconds: float = 30, find_s: float = 30, **_):
    """An agent's namespace cut off from the API for `seconds`: the veth's host side down (its
    packets go nowhere, its connections hang), then up again."""
    agent, running = _busy_agent(cluster, find_s)
    started = time.time()
    run(["ip", "link", "set", agent.host_veth, "down"])
    unreachable = False
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # whether the control plane noticed
            node = _node(cluster, agent)
            unreachable = unreachable or bool(node and node[1] == "unreachable")
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    finally:
        run(["ip", "link", "set", agent.host_veth, "up"])
        # a link going down may take the namespace's default route with it
        inside = ["ip", "netns", "exec", agent.netns]
        run([*inside, "ip", "route", "replace", "default", "via", agent.host_address], check=False)
    back = _wait_back(cluster, agent, time.time(), timeout=90)
    return _record(
        "agent_partition",
        started,
        agent=agent.name,
        running_jobs=running,
        seconds=seconds,
        # silent past the missed heartbeats, and the sweep's next look: noticed for sure
        unreachable_expected=seconds >= unreachable_within(cluster),
        went_unreachable=unreachable,
        back_after_s=back,
    )


# --- the Celery side --------------------------------------------------------------------------
def _pass_lock_holder(cluster: Cluster) -> tuple[int, str] | None:
    """(backend pid, application name) of the connection holding a pool pass's lock now."""
    rows = _query(
        cluster,
        "SELECT l.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a "
        "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s "
        "AND l.objid = %s",
        [PASS_LOCK_SPACE, cluster.pool_id],
    )
    return tuple(rows[0]) if rows else None


def _lock_left(cluster: Cluster, holder: tuple[int, str]) -> bool:
    """Whether the backend `holder` no longer holds the pass lock (read once: it may go
    between two reads)."""
    now = _pass_lock_holder(cluster)
    return now is None or now[0] != holder[0]


def worker_kill_mid_pass(cluster: Cluster, *, find_s: float = 30, down_s: float = 2, **_):
    """The Celery worker whose connection holds the drill pool's pass lock (pg_locks, the
    backend's application_name: drill-worker-N) SIGKILLed with its children, in the middle of
    the pass; restarted. Without a pass caught in `find_s`, worker-0 is killed anyway."""
    holder = None
    deadline = time.monotonic() + find_s
    with _watch(cluster) as conn:
        while time.monotonic() < deadline and conn is not None:
            rows = conn.execute(
                "SELECT l.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = %s AND l.objid = %s",
                [PASS_LOCK_SPACE, cluster.pool_id],
            ).fetchall()
            if rows and rows[0][1].startswith("drill-worker-"):
                holder = tuple(rows[0])
                break
            time.sleep(0.005)  # passes are short: look often
    name = holder[1].removeprefix("drill-") if holder else "worker-0"
    started = time.time()
    cluster.held.add(name)
    cluster.kill(name, signal.SIGKILL)
    # PostgreSQL ends the backend, and with it the session's lock, once its client is gone
    released = _poll(lambda: _lock_left(cluster, holder), timeout=30) if holder else True
    released_s = round(time.time() - started, 2)
    time.sleep(down_s)
    with cluster.lock:
        cluster.spawn(name)
        cluster.held.discard(name)
    return _record(
        "worker_kill_mid_pass",
        started,
        worker=name,
        pass_caught=holder is not None,
        lock_released=bool(released),
        lock_released_after_s=released_s,
    )


class _watch:
    """A connection for a tight watch (None when the database does not answer)."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.conn = cluster, None

    def __enter__(self):
        try:
            self.conn = self.cluster.connect()
        except Exception:
            self.conn = None
        return self.conn

    def __exit__(self, *_):
        if self.conn is not None:
            self.conn.close()


def beat_kill(cluster: Cluster, *, down_s: float = 5, **_) -> FaultRecord:
    """Beat SIGKILLed, restarted `down_s` later: no pass is scheduled meanwhile, except those
    events ask for."""
    started = time.time()
    with cluster.hold("beat"):
        cluster.kill("beat", signal.SIGKILL)
        time.sleep(down_s)
        cluster.spawn("beat")
    return _record("beat_kill", started, down_s=down_s)


def second_beat(cluster: Cluster, *, seconds: float = 20, **_) -> FaultRecord:
    """A second beat started by mistake (its own schedule file) for `seconds`, then stopped."""
    command, env = cluster.commands["beat"]
    schedule = str(cluster.dir / "beat-schedule-2")
    # the same command line, with its own schedule file (two beats cannot share one)
    second = [schedule if arg.endswith("beat-schedule") else arg for arg in command]
    # its connections named drill-beat-2 (application_name is the URL's last parameter)
    cluster.commands["beat-2"] = (second, env | {"DATABASE_URL": env["DATABASE_URL"] + "-2"})
    started = time.time()
    cluster.spawn("beat-2")
    time.sleep(seconds)
    exited = cluster.processes["beat-2"].poll()
    cluster.terminate("beat-2")
    # config/celery.py's leader lock: the second one must have stood by, never led
    said = (cluster.logs / "beat-2.log").read_text(errors="replace")
    return _record(
        "second_beat",
        started,
        seconds=seconds,
        exited_by_itself=exited,
        second_led="beat: leading" in said,
        second_stood_by="beat: standing by" in said,
    )


def postgres_restart(cluster: Cluster, **_) -> FaultRecord:
    """PostgreSQL restarted (fast: every connection cut, in-flight transactions rolled back)."""
    started = time.time()
    cluster.pg_ctl("restart")
    return _record("postgres_restart", started, took_s=round(time.time() - started, 2))


def redis_restart(cluster: Cluster, *, down_s: float = 1, **_) -> FaultRecord:
    """redis-server killed and started again on its port, empty (no persistence): queued task
    messages, channel-layer groups and locks are gone."""
    started = time.time()
    with cluster.hold("redis"):
        cluster.kill("redis", signal.SIGKILL)
        time.sleep(down_s)
        cluster.spawn("redis")
    cluster.wait_for_port(cluster.redis_port, "redis", timeout=10)
    return _record("redis_restart", started, down_s=down_s)


def redis_cut(cluster: Cluster, *, seconds: float = 20, **_) -> FaultRecord:
    """The control plane cut from Redis for `seconds` at the proxy (connections dropped, new
    ones closed at once), then let through again."""
    started = time.time()
    cluster.kill("redis-proxy", signal.SIGUSR1)
    try:
        time.sleep(seconds)
    finally:
        cluster.kill("redis-proxy", signal.SIGUSR2)
    return _record("redis_cut", started, seconds=seconds)


def web_kill(cluster: Cluster, *, down_s: float = 5, **_) -> FaultRecord:
    """web-0 SIGKILLed (its open requests and websockets cut; the balancer sends new ones to
    web-1), restarted `down_s` later."""
    started = time.time()
    with cluster.hold("web-0"):
        cluster.kill("web-0", signal.SIGKILL)
        time.sleep(down_s)
        cluster.spawn("web-0")
    cluster.wait_for_port(cluster.web_ports["web-0"], "web-0", timeout=60)
    return _record("web_kill", started, down_s=down_s, back_after_s=round(time.time() - started, 2))


FAULTS = {
    "agent_kill": agent_kill,
    "agent_freeze": agent_freeze,
    "agent_partition": agent_partition,
    "worker_kill_mid_pass": worker_kill_mid_pass,
    "beat_kill": beat_kill,
    "second_beat": second_beat,
    "postgres_restart": postgres_restart,
    "redis_restart": redis_restart,
    "redis_cut": redis_cut,
    "web_kill": web_kill,
}


def inject(cluster: Cluster, name: str, **params) -> FaultRecord:
    """Run the fault `name`; an error inside it becomes its record's `error` (the drill goes
    on to the next fault, and reports it)."""
    started = time.time()
    try:
        return FAULTS[name](cluster, **params)
    except (Exception, subprocess.SubprocessError) as exc:
        return _record(name, started, error=f"{type(exc).__name__}: {exc}")
