"""A requested checkpoint on the real Docker engine: the job gets SIGUSR1, has its grace period
to write into $CHECKPOINT_DIR, is stopped, and its checkpoint travels with the outputs
(checkpoint.tar) before `checkpointed` is reported; the next attempt finds it in its own
$CHECKPOINT_DIR when it starts (docs/data-plane.md, "Checkpoints")."""

import hashlib
import io
import os
import tarfile
import time

import pytest

from worker_agent import checkpoint
from worker_agent.agent import Agent, Config
from worker_agent.client import ApiClient
from worker_agent.runner import Runner
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessHandle, ProcessRuntime
from worker_agent.state import AgentState
from worker_agent.workroot import WorkRoot

from .conftest import IDS, make_owner
from .test_runner import run

pytestmark = pytest.mark.docker
TRAPPING = "trap 'echo saved > $CHECKPOINT_DIR/state; exit 0' USR1; while true; do sleep 1; done"


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def checkpoint_files(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_a_requested_checkpoint_is_written_uploaded_and_reported(
    agent_parts, control_plane, test_image, docker_client
):
    script = "echo out > /outputs/result.txt; " + TRAPPING
    runner = run(agent_parts, test_image, ["sh", "-c", script], wait=False, stop_grace_s=10)
    wait_for(lambda: runner.phase == "running")
    assert runner.workload()["state"] == "running"
    time.sleep(1)  # the trap is set before the shell's first sleep

    started = time.monotonic()
    runner.request_checkpoint()
    runner.join(30)

    assert not runner.is_alive()
    assert time.monotonic() - started < 8  # it exited on the signal, not at the grace's end
    job = runner.job
    assert control_plane.steps(job)[-1] == ("checkpointed", "")
    outputs = control_plane.outputs(job)
    assert outputs["result.txt"] == b"out\n"
    assert checkpoint_files(outputs["checkpoint.tar"]) == {"checkpoint/state": b"saved\n"}
    paths = [path for _, path, _ in control_plane.requests if f"jobs/{job}/" in path]
    assert paths[-1].endswith("/report")  # outputs first, then the report that re-queues
    assert (
        docker_client.containers.list(all=True, filters={"label": f"computepool.job={job}"}) == []
    )


def test_a_job_ignoring_the_signal_is_stopped_after_the_grace_period(
    agent_parts, control_plane, test_image
):
    runner = run(
        agent_parts,
        test_image,
        ["sh", "-c", "trap '' USR1; while true; do sleep 1; done"],
        wait=False,
        stop_grace_s=2,
        checkpoint_requested=True,  # asked already when the agent first saw it
    )
    runner.join(40)
    assert not runner.is_alive()
    assert control_plane.steps(runner.job)[-1] == ("checkpointed", "")
    assert "checkpoint.tar" not in control_plane.outputs(runner.job)  # nothing was written


def test_the_agent_passes_a_checkpoint_request_to_the_running_job(
    tmp_path, control_plane, test_image, docker_client
):
    job = next(IDS)
    entry = {
        "job": job,
        "attempt": 1,
        "lease": job + 1,
        "fencing_token": "5",
        "image": test_image,
        "command": ["sh", "-c", TRAPPING],
        "stop_grace_s": 10,
        "limits": {"cpu_millicores": 500, "memory_mib": 32, "pids": 64, "output_limit_mib": 16},
    }
    control_plane.assignments = [entry]
    # a whole agent reconciles every container labelled with its owner: an owner of its own
    # keeps it away from the containers of tests running beside it
    node = f"ckpt-{job}"
    agent = Agent(
        Config(api=control_plane.url, state_dir=str(tmp_path / "state"), node_name=node),
        runtimes={"docker": DockerRuntime(make_owner(node), client=docker_client)},
    )
    agent.state.save_credential({"credential": control_plane.credential})
    agent.sync()
    runner = agent.runners[(job, job + 1)]
    wait_for(lambda: runner.phase == "running")
    time.sleep(1)
    control_plane.assignments = [entry | {"state": "checkpointing", "checkpoint_requested": True}]
    agent.sync()
    runner.join(30)
    assert control_plane.steps(job)[-1] == ("checkpointed", "")
    assert "checkpoint.tar" in control_plane.outputs(job)
    agent.host.close()


def test_the_process_runtime_checkpoints_the_same_way(tmp_path, control_plane):
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": control_plane.credential})
    job = next(IDS)
    a = Assignment.parse(
        {
            "job": job,
            "lease": job + 1,
            "fencing_token": "5",
            "runtime": "process",
            "command": ["sh", "-c", TRAPPING.replace("$CHECKPOINT_DIR", '"$CHECKPOINT_DIR"')],
            "stop_grace_s": 10,
            "limits": {"memory_mib": 256, "pids": 4096},
        }
    )
    runner = Runner(
        a,
        client=ApiClient(control_plane.url, state, backoff=0.01),
        runtime=ProcessRuntime(make_owner(), tmp_path / "work"),
        workdir=WorkRoot(tmp_path / "work", state.dir).attempt_dir(job, 1),
        poll_s=0.2,
    )
    runner.start()
    wait_for(lambda: runner.phase == "running")
    time.sleep(1)
    runner.request_checkpoint()
    runner.join(30)
    assert control_plane.steps(job)[-1] == ("checkpointed", "")
    archive = control_plane.outputs(job)["checkpoint.tar"]
    assert checkpoint_files(archive) == {"checkpoint/state": b"saved\n"}


def restore_of(archive: bytes) -> dict:
    return {
        "url": "http://elsewhere.example/ignored",
        "sha256": hashlib.sha256(archive).hexdigest(),
    }


def test_the_next_attempt_starts_from_the_checkpoint(agent_parts, control_plane, test_image):
    first = run(agent_parts, test_image, ["sh", "-c", TRAPPING], wait=False, stop_grace_s=10)
    wait_for(lambda: first.phase == "running")
    time.sleep(1)
    first.request_checkpoint()
    first.join(30)
    archive = control_plane.outputs(first.job)["checkpoint.tar"]

    # attempt 2 of the same job: it reads what attempt 1 saved, and may rewrite it (as nobody)
    script = 'cat "$CHECKPOINT_DIR/state" && echo again >> "$CHECKPOINT_DIR/state"'
    second = run(
        agent_parts,
        test_image,
        ["sh", "-c", script],
        job=first.job,
        attempt=2,
        lease=first.assignment.lease + 1,
        restore=restore_of(archive),
    )

    assert control_plane.steps(first.job)[-1] == ("succeeded", "")
    assert control_plane.log_text(first.job).strip() == "saved"
    downloads = [p for m, p, _ in control_plane.requests if p.endswith("/checkpoint")]
    assert downloads == [f"agent/jobs/{first.job}/checkpoint"]  # from its own API only
    outputs = control_plane.outputs(second.job)  # the newest upload: attempt 2's state
    assert checkpoint_files(outputs["checkpoint.tar"]) == {"checkpoint/state": b"saved\nagain\n"}


def process_runner(tmp_path, control_plane, command, **changes) -> Runner:
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": control_plane.credential})
    job = changes.pop("job", None) or next(IDS)
    a = Assignment.parse(
        {
            "job": job,
            "lease": job + 1,
            "fencing_token": "5",
            "runtime": "process",
            "command": command,
            "limits": {"memory_mib": 256, "pids": 4096},
        }
        | changes
    )
    runner = Runner(
        a,
        client=ApiClient(control_plane.url, state, backoff=0.01, retries=1),
        runtime=ProcessRuntime(make_owner(), tmp_path / "work"),
        workdir=WorkRoot(tmp_path / "work", state.dir).attempt_dir(job, 2),
        poll_s=0.2,
    )
    runner.start()
    runner.join(30)
    assert not runner.is_alive()
    return runner


def test_a_checkpoint_that_does_not_verify_fails_the_attempt_before_start(tmp_path, control_plane):
    archive = tar_of(("checkpoint/state", b"saved\n"))
    job = next(IDS)
    control_plane.checkpoints[job] = archive  # served, but not what the assignment names
    command = ["sh", "-c", 'echo started; cat "$CHECKPOINT_DIR/state"']
    restore = {"url": "", "sha256": "0" * 64}
    runner = process_runner(tmp_path, control_plane, command, job=job, restore=restore)
    last = control_plane.reports(runner.job)[-1]
    assert (last["step"], last["reason"]) == ("failed", "runtime_error")
    assert "sha256" in last["message"]
    assert "started" not in control_plane.log_text(runner.job)


def test_a_missing_checkpoint_fails_the_attempt(tmp_path, control_plane):
    runner = process_runner(
        tmp_path, control_plane, ["true"], restore={"url": "", "sha256": "0" * 64}
    )
    last = control_plane.reports(runner.job)[-1]
    assert (last["step"], last["reason"]) == ("failed", "runtime_error")
    assert "404" in last["message"]


def tar_of(*files, links=()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files:
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
        for name, kind, target in links:
            entry = tarfile.TarInfo(name)
            entry.type, entry.linkname = kind, target
            tar.addfile(entry)
    return buffer.getvalue()


def test_restoring_writes_only_plain_files_below_the_checkpoint_folder(tmp_path, control_plane):
    """Through the process runtime's unpack (the engine's archive API, for containers): what the
    archive names is rewritten as plain files below checkpoint/ and unpacked nowhere else."""
    archive = tar_of(
        ("checkpoint/state", b"saved"),
        ("checkpoint/model/weights.bin", b"w"),
        ("checkpoint/../escaped", b"x"),
        ("checkpoint/./dot", b"x"),
        ("/etc/absolute", b"x"),
        ("elsewhere/file", b"x"),
        ("checkpoint", b"x"),
        ("checkpoint/planted/x", b"x"),
        links=[
            ("checkpoint/link", tarfile.SYMTYPE, "/etc/passwd"),
            ("checkpoint/hard", tarfile.LNKTYPE, "checkpoint/state"),
            ("checkpoint/fifo", tarfile.FIFOTYPE, ""),
            ("checkpoint/evil", tarfile.SYMTYPE, ".."),
            ("checkpoint/evil/through", tarfile.REGTYPE, ""),
        ],
    )
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": control_plane.credential})
    job = next(IDS)
    control_plane.checkpoints[job] = archive
    a = Assignment.parse(
        {
            "job": job,
            "lease": 1,
            "fencing_token": "1",
            "restore": {"sha256": hashlib.sha256(archive).hexdigest()},
        }
    )
    workdir = WorkRoot(tmp_path / "work", state.dir).attempt_dir(job, 2)
    root = workdir / "outputs" / "checkpoint"
    root.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "planted").symlink_to(tmp_path / "outside")  # never written through
    runtime = ProcessRuntime(make_owner(), tmp_path / "work")
    client = ApiClient(control_plane.url, state, backoff=0.01, retries=1)

    # four plain files are sent (the skipped link `evil` leaves evil/through a plain file in a
    # folder of its own); planted/x is not written through the link already there
    assert checkpoint.restore(client, a, runtime, ProcessHandle(workdir=workdir)) == 4

    found = {
        os.path.relpath(os.path.join(folder, name), tmp_path)
        for folder, _, names in os.walk(tmp_path)
        for name in names
        if "state" not in folder
    }
    prefix = os.path.relpath(root, tmp_path)
    assert found == {f"{prefix}/state", f"{prefix}/model/weights.bin", f"{prefix}/evil/through"}
    assert (root / "state").read_bytes() == b"saved"
