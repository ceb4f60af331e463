"""The agent's loop against a local HTTP server shaped like the agent API, with the local
process runtime (fast, no engine needed): enrollment, heartbeats, assignments started and
cancelled, credential rotation, and the command line."""

import os
import stat
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from worker_agent import cli
from worker_agent.agent import Agent, AgentError, Config, make_runtimes
from worker_agent.host import cpu_features
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import GVisorRuntime
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.schema import inventory_errors
from worker_agent.workroot import WorkRoot

from .conftest import require_service
from .netns import Netns, available


def assignment(job, command, **changes):
    return {
        "job": job,
        "attempt": 1,
        "lease": job * 10,
        "fencing_token": "55",
        "state": "leased",
        "image": "",
        "command": command,
        "runtime": "process",
        "stop_grace_s": 1,
        "limits": {"cpu_millicores": 1000, "memory_mib": 256, "pids": 4096},
    } | changes


def wait_for(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_enrollment_sends_a_valid_inventory_and_keeps_the_credential(agent, control_plane):
    agent.start()
    (enroll,) = control_plane.sent("enroll/")
    assert enroll["token"] == "cpe_x" and enroll["name"] == "node-a"
    assert inventory_errors(enroll["inventory"]) == []
    assert enroll["inventory"]["cpu_millicores"] >= 1000
    assert enroll["runtimes"] == ["process"]
    assert enroll["architecture"] in ("amd64", "arm64")
    assert enroll["features"] == cpu_features()  # what a job's node_features_required reads
    credential = agent.state.dir / "credential"
    assert credential.read_text() == control_plane.credential
    assert stat.S_IMODE(os.stat(credential).st_mode) == 0o600
    assert agent.heartbeat_interval == 1
    assert len(control_plane.sent("agent/inventory")) == 1


def test_a_restarted_agent_does_not_enroll_again(agent, control_plane, tmp_path):
    agent.start()
    again = Agent(agent.config, runtimes=agent.runtimes)
    again.start()
    assert len(control_plane.sent("enroll/")) == 1
    assert len(control_plane.sent("agent/me")) == 1


def test_without_a_credential_or_token_the_agent_stops(tmp_path, control_plane):
    config = Config(api=control_plane.url, state_dir=str(tmp_path))
    with pytest.raises(AgentError, match="enroll-token"):
        Agent(config, runtimes={"process": ProcessRuntime()}).start()


def test_an_assignment_runs_and_its_outputs_and_workloads_are_reported(agent, control_plane):
    agent.start()
    script = 'echo hello > "$OUTPUTS_DIR/greeting.txt"; sleep 1'
    control_plane.assignments = [assignment(11, ["sh", "-c", script])]
    agent.sync()
    wait_for(lambda: agent.runners[(11, 110)].phase == "running")
    agent.heartbeat()
    beat = control_plane.sent("agent/heartbeat")[-1]
    assert beat["workloads"] == [{"lease": 110, "job": 11, "state": "running"}]
    assert beat["runtime"] == "process" and beat["images"] == []
    wait_for(lambda: control_plane.steps(11)[-1:] == [("succeeded", "")])
    assert control_plane.outputs(11) == {"greeting.txt": b"hello\n"}
    agent.sync()  # still listed until the control plane has processed the end: not rerun
    time.sleep(0.3)
    assert [s for s, _ in control_plane.steps(11)].count("starting") == 1


def test_the_jobs_trace_context_travels_on_every_report_and_upload(agent, control_plane):
    """The assignment's `traceparent` comes back as a header on each request about the job
    (reports, logs, outputs), the final report with how long the upload took."""
    agent.start()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    script = 'echo hi; echo hello > "$OUTPUTS_DIR/greeting.txt"'
    control_plane.assignments = [assignment(12, ["sh", "-c", script], traceparent=traceparent)]
    agent.sync()
    wait_for(lambda: control_plane.steps(12)[-1:] == [("succeeded", "")])
    about_job = [
        (path, headers)
        for path, headers in control_plane.headers
        if path.startswith("agent/jobs/12/")
    ]
    kinds = {path.rsplit("/", 1)[-1] for path, _ in about_job}
    assert {"report", "logs", "outputs"} <= kinds
    assert all(headers.get("traceparent") == traceparent for _, headers in about_job)
    # requests about no job carry none
    others = [h for path, h in control_plane.headers if not path.startswith("agent/jobs/")]
    assert others and not any("traceparent" in h for h in others)
    final = control_plane.sent("agent/jobs/12/report")[-1]
    assert final["step"] == "succeeded" and 0 <= final["upload_seconds"] < 10


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n",  # requests: InvalidHeader
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX-Evil: 1",
        42,  # not a string: never sent as "42"
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"],
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",  # all-zero span id
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # uppercase
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # another version
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more",
    ],
)
def test_a_bad_traceparent_is_never_sent_and_the_job_still_runs(agent, control_plane, traceparent):
    """An assignment's `traceparent` that is not a valid W3C one (a newline made `requests`
    raise InvalidHeader and killed the runner thread; a non-string went out as text) is
    dropped: the job runs to its end and none of its requests carries a `traceparent`."""
    agent.start()
    script = 'echo hi; echo hello > "$OUTPUTS_DIR/greeting.txt"'
    control_plane.assignments = [assignment(13, ["sh", "-c", script], traceparent=traceparent)]
    agent.sync()
    wait_for(lambda: control_plane.steps(13)[-1:] == [("succeeded", "")])
    assert control_plane.outputs(13) == {"greeting.txt": b"hello\n"}
    about_job = [(p, h) for p, h in control_plane.headers if p.startswith("agent/jobs/13/")]
    assert {"report", "logs", "outputs"} <= {path.rsplit("/", 1)[-1] for path, _ in about_job}
    assert not any("traceparent" in {k.lower() for k in h} for _, h in about_job)
    assert not any("X-Evil" in h for _, h in control_plane.headers)


def test_the_client_sends_only_a_valid_traceparent(tmp_path):
    from worker_agent.client import ApiClient
    from worker_agent.state import AgentState

    client = ApiClient("http://127.0.0.1:9", AgentState(tmp_path / "state"))
    valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    client.trace_job(7, valid)
    assert client._trace_headers(7) == {"traceparent": valid}
    client.trace_job(7, valid + "\n")  # a later bad one forgets the good one, never sends it
    assert client._trace_headers(7) == {}
    client.trace_job(8, 123)
    assert client._trace_headers(8) == {}


def test_a_job_that_leaves_the_assignments_is_stopped(agent, control_plane):
    agent.start()
    control_plane.assignments = [assignment(12, ["sleep", "60"])]
    agent.sync()
    runner = agent.runners[(12, 120)]
    wait_for(lambda: runner.phase == "running")
    pid = runner.runtime.find()[0].handle.pid
    control_plane.assignments = []
    agent.sync()
    runner.join(15)
    assert not runner.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # it says it stopped (the control plane refuses it when the lease had ended: no matter)
    assert control_plane.steps(12)[-2:] == [("running", ""), ("stopped", "")]


def test_a_stopping_assignment_is_stopped_then_the_stop_confirmed(agent, control_plane):
    """Its job was cancelled: the control plane holds the lease's capacity until `stopped`."""
    agent.start()
    control_plane.assignments = [assignment(15, ["sleep", "60"])]
    agent.sync()
    runner = agent.runners[(15, 150)]
    wait_for(lambda: runner.phase == "running")
    pid = runner.runtime.find()[0].handle.pid
    control_plane.assignments = [assignment(15, ["sleep", "60"], state="stopping")]
    agent.sync()
    runner.join(15)
    assert not runner.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert control_plane.steps(15)[-2:] == [("running", ""), ("stopped", "")]
    assert len(control_plane.reports(15)) == 5  # pulling twice, starting, running, stopped
    agent.sync()  # still listed until the control plane has taken the stop: not run again
    time.sleep(0.3)
    assert len(control_plane.reports(15)) == 5


def leave_a_run(agent, job: int):
    """A run on the host that no runner follows, as a runner leaves one when the engine refused
    to stop or remove it (or the control plane was away in the middle of a restore)."""
    runtime = agent.runtimes["process"]
    run = Assignment.parse(assignment(job, ["sleep", "60"]))
    handle = runtime.create(run, agent.work.attempt_dir(job, 1))
    runtime.start(handle)
    return handle.popen


def ended(popen) -> bool:
    return popen.poll() is not None  # reaped here: this test started it


def test_a_run_no_runner_follows_and_no_longer_assigned_is_removed_by_the_loop(
    agent, control_plane
):
    agent.start()
    run = leave_a_run(agent, 23)
    agent.sync()  # the loop looks once a minute: not yet
    time.sleep(0.3)
    assert not ended(run)
    agent.next_stray_look = 0
    agent.sync()
    wait_for(lambda: ended(run) and not agent.work.attempt_path(23, 1).exists())
    assert control_plane.steps(23) == []  # nothing to say of it: it is no one's job now


def test_a_run_no_runner_follows_of_a_current_assignment_is_adopted_again(agent, control_plane):
    """Its runner ended without a report (the run left as it was): the loop adopts the run as
    reconciliation would, reports it running and follows it; cancelled, it is stopped."""
    agent.start()
    run = leave_a_run(agent, 25)
    control_plane.assignments = [assignment(25, ["sleep", "60"], state="starting")]
    agent.finished.add((25, 250))  # its runner has ended: not started afresh
    agent.next_stray_look = 0
    agent.sync()
    runner = agent.runners[(25, 250)]
    wait_for(lambda: runner.phase == "running")
    assert control_plane.steps(25) == [("running", "")]
    control_plane.assignments = []
    agent.sync()
    runner.join(15)
    wait_for(lambda: ended(run))
    assert control_plane.steps(25)[-1] == ("stopped", "")


def test_a_restarted_agent_confirms_the_stop_of_what_it_finds_nothing_of(agent, control_plane):
    control_plane.assignments = [assignment(17, ["sleep", "60"], state="stopping")]
    agent.start()  # reconciles: nothing of it here, nothing started
    runner = agent.runners[(17, 170)]
    runner.join(15)
    assert control_plane.steps(17) == [("stopped", "")]


@pytest.mark.parametrize("runtime", ["docker", "gvisor"])
def test_a_job_for_a_runtime_absent_here_is_refused_before_anything_runs(
    agent, control_plane, runtime
):
    agent.start()
    agent.heartbeat()
    assert control_plane.sent("agent/heartbeat")[-1]["runtimes"] == ["process"]
    assert control_plane.sent("agent/heartbeat")[-1]["features"] == cpu_features()
    control_plane.assignments = [assignment(13, ["true"], runtime=runtime)]
    agent.sync()
    wait_for(lambda: control_plane.steps(13) == [("failed", "runtime_unavailable")])
    [report] = control_plane.reports(13)
    assert report["message"] == f"runtime {runtime} is not offered by this node's agent"
    assert agent.runtimes["process"].find() == []  # nothing was started


@pytest.mark.docker
def test_the_engines_gvisor_runtimes_are_offered_beside_docker(tmp_path, docker_client):
    require_service(GVisorRuntime.available(), "gVisor's runsc runtimes in dockerd")
    work = WorkRoot(tmp_path / "work", tmp_path / "state")
    runtimes = make_runtimes("auto", work)
    assert list(runtimes) == ["docker", "gvisor", "process"]
    assert isinstance(runtimes["gvisor"], GVisorRuntime)
    assert list(make_runtimes("process", work)) == ["process"]


def test_the_credential_is_rotated_when_the_heartbeat_says_so(agent, control_plane):
    agent.start()
    control_plane.answers["agent/heartbeat"] = {"rotate_credential": True}
    agent.heartbeat()
    assert agent.state.credential() == "cpn_rotated" == control_plane.credential
    control_plane.answers.clear()
    agent.heartbeat()  # the next one goes with the new credential
    assert len(control_plane.sent("agent/credential/rotate")) == 1


def test_the_process_runtime_enforces_its_rlimits(agent, control_plane):
    agent.start()
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    control_plane.assignments = [assignment(14, hog, limits={"memory_mib": 32, "pids": 64})]
    agent.sync()
    wait_for(lambda: control_plane.steps(14)[-1:] == [("failed", "exited_nonzero")], 60)


def test_the_maximum_runtime_applies_to_processes_too(agent, control_plane):
    agent.start()
    control_plane.assignments = [assignment(15, ["sleep", "60"], max_runtime_s=1)]
    agent.sync()
    wait_for(lambda: control_plane.steps(15)[-1:] == [("failed", "max_runtime_exceeded")])


def test_flags_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("WORKER_AGENT_API", "http://env:8000")
    monkeypatch.setenv("WORKER_AGENT_RUNTIME", "process")
    monkeypatch.setenv("WORKER_AGENT_STATE_DIR", "/var/lib/agent")
    args = cli.parser().parse_args(["--api", "http://flag:8000"])
    assert (args.api, args.runtime, args.state_dir) == (
        "http://flag:8000",
        "process",
        "/var/lib/agent",
    )


def test_the_command_line_names_what_is_missing(monkeypatch, capsys):
    for name in ("API", "STATE_DIR"):
        monkeypatch.delenv(f"WORKER_AGENT_{name}", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert "--api and --state-dir required" in capsys.readouterr().err


def test_sigterm_stops_the_agent_process_cleanly(tmp_path, control_plane):
    env = os.environ | {
        "WORKER_AGENT_API": control_plane.url,
        "WORKER_AGENT_ENROLL_TOKEN": "cpe_x",
        "WORKER_AGENT_STATE_DIR": str(tmp_path / "state"),
        "WORKER_AGENT_RUNTIME": "process",
        "WORKER_AGENT_NODE_NAME": "node-cli",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    agent = subprocess.Popen([sys.executable, "-m", "worker_agent", "--poll-s", "0.2"], env=env)
    try:
        wait_for(lambda: control_plane.sent("agent/heartbeat"), 30)
        agent.terminate()
        assert agent.wait(15) == 0
    finally:
        agent.kill()
    assert control_plane.sent("enroll/")[0]["name"] == "node-cli"


class Numbers(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):
        Numbers.seen.append(dict(self.headers))
        body = b'{"rows": 3}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_inputs_are_fetched_before_the_job_starts(agent, control_plane):
    """Inputs come over HTTP (here from a server in a namespace of the test's own: the node's
    and the control plane's addresses are refused) into inputs/ before start."""
    require_service(available() is None, f"a network namespace of our own ({available()})")
    space = Netns()
    try:
        url = f"http://{space.address}:{space.serve(Numbers)}/data/numbers.csv"
        agent.start()
        script = 'cp "$INPUTS_DIR/numbers.csv" "$OUTPUTS_DIR/copy.json"'
        control_plane.assignments = [assignment(16, ["sh", "-c", script], inputs=[url])]
        agent.sync()
        wait_for(lambda: control_plane.steps(16)[-1:] == [("succeeded", "")])
    finally:
        space.close()
    assert control_plane.outputs(16) == {"copy.json": b'{"rows": 3}'}
    assert "Authorization" not in Numbers.seen[0]  # the credential stays home


def test_an_input_on_the_control_planes_address_is_refused(agent, control_plane):
    """The agent's own API (here on the loopback) is never an input: failed before start."""
    agent.start()
    control_plane.answers["data/numbers.csv"] = {"rows": 3}
    url = f"{control_plane.url}/data/numbers.csv"
    control_plane.assignments = [assignment(17, ["true"], inputs=[url])]
    agent.sync()
    wait_for(lambda: control_plane.steps(17)[-1:] == [("failed", "runtime_error")])
    assert not control_plane.input_headers
    (report,) = [r for r in control_plane.reports(17) if r["step"] == "failed"]
    assert "loopback: always refused" in report["message"]
