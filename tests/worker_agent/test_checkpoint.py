"""A requested checkpoint on the real Docker engine: the job gets SIGUSR1, has its grace period
to write into $CHECKPOINT_DIR, is stopped, and its checkpoint travels with the outputs
(checkpoint.tar) before `checkpointed` is reported (docs/data-plane.md, "Checkpoints")."""

import io
import itertools
import tarfile
import time

import pytest

from worker_agent.agent import Agent, Config
from worker_agent.client import ApiClient
from worker_agent.runner import Runner
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.state import AgentState

from .test_runner import run

pytestmark = pytest.mark.docker
JOBS = itertools.count(int(time.time()) % 100000 * 100 + 80)
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
    job = next(JOBS)
    entry = {
        "job": job,
        "attempt": 1,
        "lease": job + 1,
        "fencing_token": "5",
        "image": test_image,
        "command": ["sh", "-c", TRAPPING],
        "stop_grace_s": 10,
        "limits": {"cpu_millicores": 500, "memory_mib": 32, "pids": 64},
    }
    control_plane.assignments = [entry]
    agent = Agent(
        Config(api=control_plane.url, state_dir=str(tmp_path / "state"), node_name="test-node"),
        runtimes={"docker": DockerRuntime("test-node", client=docker_client)},
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
    job = next(JOBS)
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
        runtime=ProcessRuntime("test-node", tmp_path / "state"),
        workdir=state.attempt_dir(job, 1),
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
