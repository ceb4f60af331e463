"""The drill (config/drill/, issue 25): its balancer and Redis proxy, its fleet — started for
real (own PostgreSQL and Redis, TLS web processes, workers, beat, agents in network namespaces)
and stopped leaving nothing behind, also after a start that failed midway — and the bounded
drill, whose counts that must be zero are zero."""

import json
import os
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from config.drill.cluster import Cluster, ClusterError, containers_of, run
from config.drill.proxy import __file__ as PROXY_FILE
from config.management.commands.runstack import docker_answers, registry_answers
from config.roles import MANAGE
from tests.conftest import require_service


# --- the proxy (balancer and Redis cut) ----------------------------------------------------------
class _Named(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _backend(name: bytes):
    """A TCP server answering every line with its name; (server, port)."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            for _line in self.rfile:
                self.wfile.write(name + b"\n")

    server = _Named(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ask(port: int) -> bytes:
    """One line through the proxy; b"" when the proxy closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(b"hello\n")
            return sock.makefile("rb").readline().strip()
        except (ConnectionError, TimeoutError):
            return b""


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def proxy():
    started = []

    def start(*backends: int) -> tuple[subprocess.Popen, int]:
        port = _free_port()
        command = [sys.executable, PROXY_FILE, "--listen", f"127.0.0.1:{port}"]
        for backend in backends:
            command += ["--backend", f"127.0.0.1:{backend}"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        started.append(process)
        _wait_listening(port)
        return process, port

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def test_the_balancer_takes_backends_in_turn_and_skips_one_that_refuses(proxy):
    (a, port_a), (b, port_b) = _backend(b"a"), _backend(b"b")
    try:
        _, port = proxy(_free_port(), port_a, port_b)  # the first refuses: nothing listens
        answers = [_ask(port) for _ in range(6)]
        assert set(answers) == {b"a", b"b"}  # every one answered, by both in turn
        a.shutdown()
        a.server_close()
        assert {_ask(port) for _ in range(4)} == {b"b"}  # a gone: b takes every connection
    finally:
        b.shutdown()
        b.server_close()


def test_the_redis_proxy_cut_drops_connections_until_it_is_let_through_again(proxy):
    server, backend = _backend(b"redis")
    try:
        process, port = proxy(backend)
        held = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.sendall(b"ping\n")
        reader = held.makefile("rb")
        assert reader.readline().strip() == b"redis"
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        _assert_cut(held, reader)
        assert _ask(port) == b""  # a new connection is closed at once
        process.send_signal(signal.SIGUSR2)
        time.sleep(0.3)
        assert _ask(port) == b"redis"
        held.close()
    finally:
        server.shutdown()
        server.server_close()


def _assert_cut(sock, reader) -> None:
    """The held connection was cut: a read gets EOF or a reset."""
    try:
        sock.sendall(b"ping\n")
        assert reader.readline() == b""
    except ConnectionError:
        pass


# --- the command's input -----------------------------------------------------------------------
@pytest.fixture
def no_drill(monkeypatch):
    """The command with its machine check and its drill stubbed: a refusal must come before
    either (a drill that ran would fail the test, not start a fleet)."""
    from config.management.commands import drill

    def ran(**kwargs):
        raise AssertionError(f"the drill ran with {kwargs}")

    monkeypatch.setattr(drill, "run_drill", ran)
    monkeypatch.setattr(drill.Command, "check_machine", staticmethod(lambda: None))


def test_drill_refuses_an_unknown_fault_naming_the_known_ones(no_drill):
    with pytest.raises(CommandError) as refused:
        call_command("drill", "--faults", "agent_kill,meteor_strike")
    assert "meteor_strike" in str(refused.value)
    assert "postgres_restart" in str(refused.value)


@pytest.mark.parametrize("faults", ["", ",", " , ,"])
def test_drill_refuses_a_fault_list_that_names_none(no_drill, faults):
    with pytest.raises(CommandError) as refused:
        call_command("drill", "--faults", faults)
    assert "names no fault" in str(refused.value)
    assert "agent_kill" in str(refused.value) and "web_kill" in str(refused.value)


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "1e12", "0", "0.5", "-3", "3601"])
def test_drill_refuses_seconds_that_are_not_a_finite_sane_length(no_drill, seconds):
    with pytest.raises(CommandError) as refused:
        call_command("drill", "--bounded", f"--seconds={seconds}")
    assert "--seconds must be a number of seconds from 1 to 3600" in str(refused.value)


def test_drill_takes_seconds_in_range_and_a_named_fault(monkeypatch):
    from config.management.commands import drill

    ran = {}
    monkeypatch.setattr(drill.Command, "check_machine", staticmethod(lambda: None))
    monkeypatch.setattr(drill, "run_drill", lambda **kwargs: ran.update(kwargs) or passing())
    call_command("drill", "--json", "--faults", " web_kill ,", "--seconds", "90")
    assert ran["faults"] == ["web_kill"] and ran["seconds"] == 90.0


# --- the verdict (failures) ------------------------------------------------------------------
def fault(name: str, **detail) -> dict:
    return {"name": name, "started_at": 1.0, "ended_at": 2.0, "detail": detail}


GOOD_FAULTS = {
    "agent_kill": {"agent": "agent-0", "running_jobs": 3, "back_after_s": 1.2},
    "agent_freeze": {
        "agent": "agent-1",
        "running_jobs": 2,
        "committed_when_frozen": 2,
        "expected": "uncertain",
        "uncertain_leases": 2,
        "went_uncertain": True,
        "frozen_s": 9.0,
        "back_after_s": 0.5,
    },
    "agent_partition": {
        "agent": "agent-2",
        "running_jobs": 4,
        "seconds": 30,
        "unreachable_expected": True,
        "went_unreachable": True,
        "back_after_s": 5.0,
    },
    "worker_kill_mid_pass": {
        "worker": "worker-1",
        "pass_caught": True,
        "lock_released": True,
        "lock_released_after_s": 0.1,
    },
    "beat_kill": {"down_s": 5},
    "second_beat": {
        "seconds": 20,
        "exited_by_itself": None,
        "second_led": False,
        "second_stood_by": True,
    },
    "postgres_restart": {"took_s": 0.4},
    "redis_restart": {"down_s": 1},
    "redis_cut": {"seconds": 20},
    "web_kill": {"down_s": 5, "back_after_s": 7.0},
}


def passing(**changes) -> dict:
    """A drill result that passes: every fault ran and found what it should."""
    from config.drill.run import ZEROS

    names = list(GOOD_FAULTS)
    result = dict.fromkeys(ZEROS, 0) | {
        "profile": "full",
        "faults_planned": names,
        "faults": [fault(name, **GOOD_FAULTS[name]) for name in names],
        "jobs_by_state": {"succeeded": 12, "cancelled": 1},
        "hostile": {
            "bad_shapes": {"outcomes": {"4xx:400": 12}, "accepted": []},
            "requests": 31,
            "not_4xx": 0,
            "skipped": [],
        },
        "details": {"double_runs_engine": {"containers_started": 12, "watch_error": None}},
        "unexpected_exits": [],
        "leftovers": [],
    }
    return result | changes


def with_fault(name: str, **detail) -> dict:
    result = passing()
    result["faults"] = [
        fault(f["name"], **(f["detail"] | detail)) if f["name"] == name else f
        for f in result["faults"]
    ]
    return result


def test_a_drill_whose_jobs_never_succeeded_fails_even_with_its_zeros():
    from config.drill.run import failures

    assert failures(passing()) == []
    assert failures(passing(jobs_by_state={"queued": 12})) == [
        "no job succeeded: the drill proved nothing"
    ]


@pytest.mark.parametrize(
    ("name", "detail", "why"),
    [
        ("agent_kill", {"back_after_s": None}, "never ready and reachable again"),
        ("agent_freeze", {"went_uncertain": False}, "its leases were never held uncertain"),
        (
            "agent_freeze",
            {"running_jobs": 0, "committed_when_frozen": 0, "expected": "unreachable"}
            | {"went_uncertain": False},
            "its node never went unreachable",
        ),
        ("agent_freeze", {"back_after_s": None}, "never ready and reachable again"),
        ("agent_partition", {"went_unreachable": False}, "its node never went unreachable"),
        ("agent_partition", {"back_after_s": None}, "never ready and reachable again"),
        ("worker_kill_mid_pass", {"lock_released": False}, "pass lock"),
        ("second_beat", {"second_led": True, "second_stood_by": False}, "the second beat led"),
        ("second_beat", {"exited_by_itself": 1}, "exited by itself"),
    ],
)
def test_a_fault_that_found_the_product_wrong_fails_the_drill(name, detail, why):
    from config.drill.run import failures

    (found,) = failures(with_fault(name, **detail))
    assert found.startswith(f"fault {name}: ") and why in found


@pytest.mark.parametrize(
    ("name", "detail", "note"),
    [
        ("worker_kill_mid_pass", {"pass_caught": False, "lock_released": True}, "killed idle"),
        ("agent_kill", {"running_jobs": 0}, "ran no job"),
        (
            "agent_partition",
            {"seconds": 3, "unreachable_expected": False, "went_unreachable": False},
            "too short",
        ),
        ("second_beat", {"second_stood_by": False}, "never came to the leader lock"),
    ],
)
def test_a_fault_that_missed_its_moment_is_said_so_but_is_no_failure(name, detail, note):
    from config.drill.run import failures, judge_fault

    result = with_fault(name, **detail)
    assert failures(result) == []
    (judged,) = [judge_fault(f) for f in result["faults"] if f["name"] == name]
    assert judged["reached"] is False and note in judged["note"] and judged["failed"] == []


def test_every_planned_fault_must_have_its_record():
    from config.drill.run import failures

    result = passing()
    result["faults"] = result["faults"][:-1]
    (found,) = failures(result)
    assert found.startswith("9 fault records for 10 faults planned")
    assert failures(passing(faults_planned=[], faults=[])) == [
        "no fault was planned: the drill broke nothing"
    ]


def test_a_hostile_answer_other_than_4xx_or_a_skipped_probe_fails_the_drill():
    from config.drill.run import failures

    hostile = passing()["hostile"]
    accepted = {"outcomes": {"2xx": 1}, "accepted": ["GET /jobs/7: 2xx"]}
    (found,) = failures(passing(hostile=hostile | {"other_tenants": accepted, "not_4xx": 1}))
    assert "other than 4xx" in found and "GET /jobs/7: 2xx" in found
    # `accepted` alone (a count that disagrees) is enough
    assert failures(passing(hostile=hostile | {"other_tenants": accepted}))
    skipped = ["other_tenants: GET job (their job was not made: 5xx)"]
    (found,) = failures(passing(hostile=hostile | {"skipped": skipped}))
    assert "skipped probes" in found and "their job was not made" in found
    assert failures(passing(hostile=None)) == ["the hostile burst sent nothing"]
    result = passing()
    del result["hostile"]
    assert failures(result) == ["no hostile burst was sent"]


def test_a_process_that_exited_on_its_own_fails_the_drill():
    from config.drill.run import failures

    exits = [{"name": "worker-1", "at": 5.0, "returncode": 1}]
    assert failures(passing(unexpected_exits=exits)) == [
        "processes exited on their own: worker-1 (1)"
    ]


def test_an_engine_watch_that_broke_or_saw_no_run_fails_the_drill():
    from config.drill.run import failures

    broken = {"containers_started": 3, "watch_error": "ReadTimeout: gone"}
    found = failures(passing(double_runs=None, details={"double_runs_engine": broken}))
    assert found == ["double_runs = None", "the engine's event watch broke: ReadTimeout: gone"]
    assert failures(passing(runs_unseen_by_engine=12)) == ["runs_unseen_by_engine = 12"]


def test_the_pass_lock_is_seen_released_whenever_its_holder_goes_between_two_reads(monkeypatch):
    """The worker-kill fault polls pg_locks while PostgreSQL ends the killed backend: any read
    may find the lock gone (a CI run once failed the drill on a second read that did)."""
    from config.drill import faults

    holder = (4242, "drill-worker-0")
    reads = iter([[holder], [(5151, "drill-worker-1")], []])
    monkeypatch.setattr(faults, "_query", lambda *_args, **_kw: next(reads))
    cluster = types.SimpleNamespace(pool_id=7)
    assert faults._lock_left(cluster, holder) is False  # still held by the killed backend
    assert faults._lock_left(cluster, holder) is True  # another worker's pass took it
    assert faults._lock_left(cluster, holder) is True  # nobody holds it


# --- the fleet ---------------------------------------------------------------------------------
def _require_fleet_services():
    require_service(os.geteuid() == 0, "root (network namespaces)")
    require_service(docker_answers(), "the Docker engine")
    require_service(registry_answers() == (True, True), "the loopback registry's test image")


def _nothing_left(cluster: Cluster) -> None:
    """Looked at from outside, not through the cluster's own bookkeeping."""
    namespaces = run(["ip", "netns", "list"]).stdout
    links = run(["ip", "-o", "link", "show"]).stdout
    assert cluster.tag not in namespaces
    assert f"dr{cluster.tag}" not in links
    for name, process in cluster.processes.items():
        assert process.poll() is not None, name
    assert containers_of(cluster.control_plane) == []
    assert not cluster.pg_dir.exists()
    assert not cluster.dir.exists()
    with pytest.raises(OSError):  # its PostgreSQL no longer answers
        socket.create_connection(("127.0.0.1", cluster.pg_port), timeout=1).close()


def _a_fleet_as_deployed(cluster: Cluster) -> None:
    """Each agent in a namespace of its own, its node ready; the API over TLS that only the
    drill's CA verifies; the control plane's processes started by their role entry points."""
    states = cluster.node_states()
    assert len(states) == 3
    assert {state[:2] for state in states.values()} == {("ready", "reachable")}
    namespaces = {
        run(["ip", "netns", "identify", str(a.process.pid)]).stdout.strip() for a in cluster.agents
    }
    assert namespaces == {a.netns for a in cluster.agents}
    assert cluster.api_answers()
    with pytest.raises(urllib.error.URLError) as untrusted:
        urllib.request.urlopen(f"{cluster.api_url}/healthz", timeout=5)
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
    request = urllib.request.Request(  # a member's token works through it
        f"{cluster.api_url}/api/v1/pools",
        headers={"Authorization": f"Bearer {cluster.tokens['vision']}"},
    )
    with urllib.request.urlopen(request, context=cluster.ssl_context(), timeout=10) as r:
        assert "drill" in {pool["slug"] for pool in json.load(r)["results"]}
    for name in ("web-0", "web-1", "worker-0", "worker-1", "beat"):
        command, _env = cluster.commands[name]
        assert command[1:4] == [str(MANAGE), "role", name.partition("-")[0]], command
        server = Path(f"/proc/{cluster.processes[name].pid}/cmdline").read_bytes()
        assert b"hypercorn" in server or b"celery" in server  # exec'd: the server itself


@pytest.mark.slow
@pytest.mark.docker
def test_a_fleet_whose_start_fails_midway_is_removed_all_the_same():
    _require_fleet_services()
    # everything is made, then the nodes cannot be ready in no time: start fails
    cluster = Cluster(agents_count=3, ready_timeout_s=0.01)
    with pytest.raises(ClusterError, match="not all ready"):
        cluster.start()
    assert cluster.leftovers() == []
    _nothing_left(cluster)


# --- the bounded drill -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
def test_the_bounded_drill_ends_with_every_count_that_must_be_zero_at_zero():
    _require_fleet_services()
    pytest.importorskip("config.drill.load")  # helper C's load and audit
    pytest.importorskip("config.drill.audit")
    from config.drill.run import ZEROS, failures, run_drill

    started, fleets = time.monotonic(), []

    def look(cluster):
        fleets.append(cluster)
        _a_fleet_as_deployed(cluster)

    result = run_drill(profile="bounded", say=lambda message: None, on_started=look)
    assert len(fleets) == 1, json.dumps(result)[-3000:]  # it started, and was as deployed
    assert failures(result) == [], json.dumps(result)[-3000:]
    for name in ZEROS:
        assert result[name] == 0
    assert [f["name"] for f in result["faults"]] == list(result["faults_planned"])
    assert all("error" not in f["detail"] for f in result["faults"])
    assert result["leftovers"] == []
    _nothing_left(fleets[0])
    assert time.monotonic() - started < 240
