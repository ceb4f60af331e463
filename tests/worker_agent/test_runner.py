"""One assignment run by the agent's runner on the real Docker engine, reporting to a local
HTTP server shaped like the agent API: every step in order with the fencing token, logs and
outputs before the final report, and the ways a run ends (docs/data-plane.md)."""

import hashlib
import io
import tarfile
import time

import pytest

from worker_agent import runner as runner_module
from worker_agent.client import ApiError
from worker_agent.runner import Runner
from worker_agent.runtime import disks
from worker_agent.runtime.base import Assignment
from worker_agent.workroot import WorkRoot

from .conftest import IDS

pytestmark = pytest.mark.docker


def assignment(job: int, image, command, **changes) -> Assignment:
    data = {
        "job": job,
        "attempt": 1,
        "lease": job + 1,
        "fencing_token": "987654321",
        "state": "leased",
        "image": image,
        "command": command,
        "max_runtime_s": 60,
        "stop_grace_s": 1,
        "limits": {"cpu_millicores": 500, "memory_mib": 32, "pids": 64},
    } | changes
    data["limits"] = {"output_limit_mib": 16} | data["limits"]  # every job has one
    return Assignment.parse(data)


def attempt_dir(state, job: int):
    return WorkRoot(state.dir.parent / "work", state.dir).attempt_dir(job, 1)


def run(agent_parts, image, command, *, wait=True, **changes) -> Runner:
    state, client, runtime = agent_parts
    job = changes.pop("job", None) or next(IDS)  # a next attempt names its job
    a = assignment(job, image, command, **changes)
    runner = Runner(a, client=client, runtime=runtime, workdir=attempt_dir(state, job))
    runner.poll_s = 0.2
    runner.start()
    if wait:
        runner.join(60)
        assert not runner.is_alive()
    return runner


def containers_of(docker_client, job):
    return docker_client.containers.list(all=True, filters={"label": f"computepool.job={job}"})


def test_a_job_runs_reports_each_step_and_uploads_outputs_and_logs(
    agent_parts, control_plane, test_image, docker_client
):
    script = "echo hello > /outputs/greeting.txt; echo done; ln -s /etc/passwd /outputs/leak"
    runner = run(agent_parts, test_image, ["sh", "-c", script])
    job = runner.job
    assert control_plane.steps(job) == [
        ("pulling", "image_pulling"),
        ("pulling", "image_pulled"),
        ("starting", ""),
        ("running", ""),
        ("succeeded", ""),
    ]
    reports = control_plane.reports(job)
    assert {r["fencing_token"] for r in reports} == {"987654321"}
    assert reports[-1]["exit_code"] == 0
    assert reports[1]["pull_seconds"] >= 0
    assert control_plane.outputs(job) == {"greeting.txt": b"hello\n"}  # the link is skipped
    assert "done" in control_plane.log_text(job)
    # the final report comes after the logs and outputs it ends with
    paths = [path for _, path, _ in control_plane.requests if f"jobs/{job}/" in path]
    assert paths[-1].endswith("/report")
    assert containers_of(docker_client, job) == []  # removed, scratch too
    assert not runner.workdir.exists()


def test_a_nonzero_exit_is_reported_with_its_code(agent_parts, control_plane, test_image):
    runner = run(agent_parts, test_image, ["sh", "-c", "echo oops; exit 3"])
    last = control_plane.reports(runner.job)[-1]
    assert (last["step"], last["reason"], last["exit_code"]) == ("failed", "exited_nonzero", 3)


def test_a_memory_hog_is_reported_oom_killed(agent_parts, control_plane, test_image):
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    runner = run(agent_parts, test_image, hog, limits={"memory_mib": 16})
    assert control_plane.steps(runner.job)[-1] == ("failed", "oom_killed")


def test_the_maximum_runtime_kills_the_job(agent_parts, control_plane, test_image):
    started = time.monotonic()
    runner = run(agent_parts, test_image, ["sleep", "60"], max_runtime_s=2)
    assert time.monotonic() - started < 30
    assert control_plane.steps(runner.job)[-1] == ("failed", "max_runtime_exceeded")


def test_a_tag_is_refused_before_anything_starts(
    agent_parts, control_plane, test_image, docker_client
):
    tag = test_image.split("@")[0] + ":test"
    runner = run(agent_parts, tag, ["true"])
    steps = control_plane.steps(runner.job)
    assert steps[-1] == ("failed", "image_invalid")
    assert "starting" not in [step for step, _ in steps]
    assert containers_of(docker_client, runner.job) == []


def test_a_cancelled_job_is_stopped_and_removed_then_the_stop_reported(
    agent_parts, control_plane, test_image, docker_client
):
    runner = run(agent_parts, test_image, ["sleep", "60"], wait=False)
    deadline = time.monotonic() + 30
    while runner.phase != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert runner.workload()["state"] == "running"
    seen = []  # what of the container is left when the stop is reported
    control_plane.on_report = lambda body: seen.append(containers_of(docker_client, runner.job))
    runner.cancel()  # what the agent does when the job leaves the assignments or is stopping
    runner.join(30)
    assert not runner.is_alive()
    assert control_plane.steps(runner.job)[-2:] == [("running", ""), ("stopped", "")]
    assert seen == [[]]  # reported once its container was gone
    assert containers_of(docker_client, runner.job) == []


def test_a_refused_starting_report_starts_nothing(
    agent_parts, control_plane, test_image, docker_client
):
    control_plane.refuse_steps = {"starting"}  # 409: the token is no longer the job's
    runner = run(agent_parts, test_image, ["sleep", "60"])
    assert [r["step"] for r in control_plane.reports(runner.job)][-1] == "starting"
    assert containers_of(docker_client, runner.job) == []


@pytest.mark.parametrize("step", ["pulling", "starting", "succeeded"])
def test_a_report_the_control_plane_cannot_take_for_a_while_is_sent_until_taken(
    agent_parts, control_plane, test_image, step, monkeypatch
):
    """The control plane answers 503 longer than the client's own retries (its Redis cut for
    20 s in the drill): the report is sent again until taken, and the run goes on; never a
    failure it was not."""
    _, client, _ = agent_parts
    control_plane.unavailable_steps = {step: client.retries + 3}
    monkeypatch.setattr(runner_module, "REPORT_RETRY_S", 0.2)
    runner = run(agent_parts, test_image, ["sh", "-c", "true"])
    steps = [r["step"] for r in control_plane.reports(runner.job)]
    assert steps[-1] == "succeeded" and "failed" not in steps
    assert control_plane.unavailable_steps == {step: 0}  # every 503 was met


def test_a_halted_agent_leaves_the_container_and_a_new_one_adopts_it(
    agent_parts, control_plane, test_image, docker_client
):
    _, client, runtime = agent_parts
    # long enough that the job still runs when the halted agent is looked at, under load too
    runner = run(agent_parts, test_image, ["sh", "-c", "sleep 6; exit 4"], wait=False)
    while runner.phase != "running":
        time.sleep(0.1)
    runner.halt()
    runner.join(10)
    assert len(containers_of(docker_client, runner.job)) == 1  # still there
    found = {(f.job, f.lease): f for f in runtime.find()}[runner.assignment.key]
    adopted = Runner(
        runner.assignment, client=client, runtime=runtime, workdir=runner.workdir, found=found
    )
    adopted.start()
    adopted.join(30)
    last = control_plane.reports(runner.job)[-1]
    assert (last["step"], last["exit_code"]) == ("failed", 4)
    assert containers_of(docker_client, runner.job) == []


def test_a_starting_job_whose_container_was_never_made_is_launched_afresh(
    agent_parts, control_plane, test_image, docker_client
):
    """The agent died after its `starting` report was taken and before it created the
    container: nothing ran, so the next agent launches the attempt again under the same lease
    (it had been failed `runtime_error`, "the container is gone"; found by the fleet drill)."""
    runner = run(agent_parts, test_image, ["sh", "-c", "true"], state="starting")
    assert control_plane.steps(runner.job) == [
        ("pulling", "image_pulling"),
        ("pulling", "image_pulled"),
        ("starting", ""),
        ("running", ""),
        ("succeeded", ""),
    ]
    assert containers_of(docker_client, runner.job) == []


def test_a_container_created_but_never_started_is_started_afresh_by_the_next_agent(
    agent_parts, control_plane, test_image, docker_client
):
    """The agent died between the container's create and its start (the job `starting`): the
    next agent finds it `created`. It never ran, so that agent removes it and starts the
    attempt afresh under the same lease, never following it as running until the maximum
    runtime kills it (found by the fleet drill)."""
    state, client, runtime = agent_parts
    job = next(IDS)
    a = assignment(job, test_image, ["sh", "-c", "sleep 1"], state="starting")
    workdir = attempt_dir(state, job)
    (workdir / "inputs").mkdir(parents=True)  # as the runner prepares it
    created = runtime.create(a, workdir)  # same name and labels; never started
    try:
        created.reload()
        assert created.status == "created"
        found = {(f.job, f.lease): f for f in runtime.find()}[a.key]
        assert (found.running, found.ended) == (False, None)  # neither running nor ended
        began = time.monotonic()
        adopted = Runner(a, client=client, runtime=runtime, workdir=workdir, found=found)
        adopted.poll_s = 0.2
        adopted.start()
        adopted.join(30)
        assert not adopted.is_alive(), "followed as if it ran (until its maximum runtime)"
        assert time.monotonic() - began < 20
        assert control_plane.steps(job) == [  # launched again, under the same lease
            ("pulling", "image_pulling"),
            ("pulling", "image_pulled"),
            ("starting", ""),
            ("running", ""),
            ("succeeded", ""),
        ]
        assert control_plane.reports(job)[-1]["exit_code"] == 0
        assert containers_of(docker_client, job) == []
        assert not workdir.exists()
    finally:
        for container in containers_of(docker_client, job):
            container.remove(force=True)
        disks.release(workdir)


def wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def remove_leftovers(docker_client, job, workdir):
    for container in containers_of(docker_client, job):
        container.remove(force=True)
    disks.release(workdir)


@pytest.mark.parametrize("step", ["running", "succeeded"])
def test_an_agent_stopping_while_a_report_is_not_taken_leaves_the_run_to_the_next_agent(
    agent_parts, control_plane, test_image, docker_client, step, monkeypatch
):
    """The agent stops while the control plane answers 503 to the run's `running` (or end)
    report, past the client's retries: as with an unreachable control plane, the container and
    its directory stay for the next agent, which adopts the run; nothing is reported failed (it
    was failed "agent error", and the directory deleted under a container meant to run on)."""
    _, client, runtime = agent_parts
    monkeypatch.setattr(runner_module, "REPORT_RETRY_S", 0.1)
    control_plane.unavailable_steps = {step: 10**6}
    script = "echo hi > /outputs/a.txt" + ("; sleep 4" if step == "running" else "")
    job = next(IDS)
    runner = run(agent_parts, test_image, ["sh", "-c", script], job=job, wait=False)
    try:
        # past the client's retries: the runner sends it again (once at least)
        sent = lambda: [r["step"] for r in control_plane.reports(job)].count(step)  # noqa: E731
        wait_until(lambda: sent() > client.retries + 1)
        runner.halt()
        runner.join(15)
        assert not runner.is_alive()
        assert "failed" not in [r["step"] for r in control_plane.reports(job)]
        assert len(containers_of(docker_client, job)) == 1  # left, as is its directory
        assert (runner.workdir / "inputs").is_dir()
        assert runner.phase == "left running"  # what the agent keeps MPS daemons for
        control_plane.unavailable_steps = {}  # the control plane is back; a new agent starts
        found = {(f.job, f.lease): f for f in runtime.find()}[runner.assignment.key]
        adopted = Runner(
            runner.assignment, client=client, runtime=runtime, workdir=runner.workdir, found=found
        )
        adopted.poll_s = 0.2
        adopted.start()
        adopted.join(30)
        assert not adopted.is_alive()
        assert control_plane.steps(job)[-1] == ("succeeded", "")
        assert "failed" not in [r["step"] for r in control_plane.reports(job)]
        assert control_plane.outputs(job) == {"a.txt": b"hi\n"}
        assert containers_of(docker_client, job) == []
        assert not runner.workdir.exists()
    finally:
        runner.halt()
        remove_leftovers(docker_client, job, runner.workdir)


@pytest.mark.parametrize("fault", ["a 500 on running", "a bug in the watch"])
def test_a_run_the_runner_fails_itself_is_stopped_before_the_failure_is_reported(
    agent_parts, control_plane, test_image, docker_client, fault, monkeypatch
):
    """An answer not to send again (a 500 on `running`) or an unexpected error once the
    container runs: the runner reports the attempt failed, so its container is stopped and
    removed first; it ran on after that report (the control plane could retry the job on
    another node while it still ran: two runs)."""
    _, client, runtime = agent_parts
    if fault == "a 500 on running":
        report = client.report

        def refusing(job, body):
            if body["step"] == "running":
                raise ApiError(500, {"detail": "boom"}, "POST", f"agent/jobs/{job}/report")
            return report(job, body)

        monkeypatch.setattr(client, "report", refusing)
    else:

        def broken(handle):
            raise RuntimeError("a bug")

        monkeypatch.setattr(runtime, "stats", broken)
    job = next(IDS)
    left = []  # what of the container is there when the failure is reported
    control_plane.on_report = lambda body: (
        left.append(containers_of(docker_client, job)) if body["step"] == "failed" else None
    )
    runner = run(agent_parts, test_image, ["sleep", "60"], job=job, wait=False)
    try:
        runner.join(30)
        assert not runner.is_alive()
        assert control_plane.steps(job)[-1] == ("failed", "runtime_error")
        assert "agent error" in control_plane.reports(job)[-1]["message"]
        assert left == [[]]  # gone before the failure was reported
        assert not runner.workdir.exists()
    finally:
        remove_leftovers(docker_client, job, runner.workdir)


def test_a_refused_running_report_of_an_adopted_container_stops_it(
    agent_parts, control_plane, test_image, docker_client
):
    """The next agent adopts a running container and its `running` report is refused (409:
    the lease ended meanwhile): the attempt is no longer this node's, so nothing of it runs on
    (it was followed no further and left running)."""
    _, client, runtime = agent_parts
    job = next(IDS)
    runner = run(agent_parts, test_image, ["sleep", "60"], job=job, wait=False)
    try:
        wait_until(lambda: runner.phase == "running")
        runner.halt()
        runner.join(10)
        assert len(containers_of(docker_client, job)) == 1
        control_plane.refuse_steps = {"running"}
        found = {(f.job, f.lease): f for f in runtime.find()}[runner.assignment.key]
        adopted = Runner(
            runner.assignment, client=client, runtime=runtime, workdir=runner.workdir, found=found
        )
        adopted.start()
        adopted.join(30)
        assert not adopted.is_alive()
        assert containers_of(docker_client, job) == []
        assert not runner.workdir.exists()
        assert "failed" not in [r["step"] for r in control_plane.reports(job)]
    finally:
        remove_leftovers(docker_client, job, runner.workdir)


@pytest.mark.parametrize("step", ["pulling", "starting"])
def test_waiting_for_the_control_plane_does_not_count_against_the_startup_timeout(
    agent_parts, control_plane, test_image, step, monkeypatch
):
    """The control plane answers 503 to the pull's or the start's report for longer than the
    job's startup timeout: the run still starts, its checkpoint restored before (its deadline
    is the runner's own work, not the wait for a report to be taken; it failed
    `startup_timed_out` at once)."""
    _, client, _ = agent_parts
    monkeypatch.setattr(runner_module, "REPORT_RETRY_S", 0.5)
    control_plane.unavailable_steps = {step: (client.retries + 1) * 8}  # some 6 s of 503s
    job = next(IDS)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("checkpoint/state")
        member.size = len(b"saved\n")
        tar.addfile(member, io.BytesIO(b"saved\n"))
    control_plane.checkpoints[job] = archive.getvalue()
    restore = {"url": "", "sha256": hashlib.sha256(archive.getvalue()).hexdigest()}
    script = 'cat "$CHECKPOINT_DIR/state"'
    began = time.monotonic()
    run(
        agent_parts, test_image, ["sh", "-c", script], job=job, startup_timeout_s=4, restore=restore
    )
    assert time.monotonic() - began > 4  # away for longer than the startup timeout
    assert control_plane.unavailable_steps == {step: 0}
    assert control_plane.steps(job)[-1] == ("succeeded", "")
    assert control_plane.log_text(job).strip() == "saved"  # restored within the deadline


def test_a_report_sent_again_and_again_is_logged_at_first_then_once_a_minute(
    tmp_path, caplog, monkeypatch
):
    """The runner sends a report again until it is taken, however long that takes: its warning
    is logged the first time, then at most once a minute with how many times it was sent."""
    a = assignment(next(IDS), "img", ["true"])
    runner = Runner(a, client=None, runtime=None, workdir=tmp_path)
    runner.report_retry_s = 0
    caplog.set_level("WARNING", logger="worker_agent.runner")
    unavailable = ApiError(503, {"code": "database_unavailable"}, "POST", "report")
    for _ in range(50):
        assert runner._again("running", unavailable)
    assert len(caplog.records) == 1
    now = time.monotonic()
    monkeypatch.setattr(runner_module.time, "monotonic", lambda: now + 61)
    for _ in range(50):
        runner._again("running", unavailable)
    assert len(caplog.records) == 2
    assert "51 sends failed" in caplog.records[-1].getMessage()
