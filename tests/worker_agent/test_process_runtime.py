"""The process runtime's launch (worker_agent/runtime/process.py): its pid file is written
before the job's command may run. An agent killed between the process's start and that record
leaves nothing running the command, so the next agent's relaunch of the `starting` attempt is
its only copy; one killed just after it leaves a copy that the next agent adopts."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_agent import assignment, wait_for

ROOT = Path(__file__).resolve().parents[2]

# An agent that starts the attempt's process and is killed (SIGKILL) in `window`: in
# `_record` (before the pid file is written) or in `_release` (after it, before the word).
KILLED_AGENT = """
import json, os, signal, sys
from pathlib import Path
from worker_agent.runtime import process
from worker_agent.runtime.base import Assignment, Owner

args = json.loads(sys.argv[1])
runtime = process.ProcessRuntime(Owner(**args["owner"]), args["work_dir"])
setattr(process.ProcessRuntime, args["window"], lambda *_: os.kill(os.getpid(), signal.SIGKILL))
handle = runtime.create(Assignment.parse(args["assignment"]), Path(args["workdir"]))
runtime.start(handle)
"""


def launch_and_kill(agent, data: dict, window: str) -> None:
    """What a killed agent left of its launch of `data` (its runtime's owner is the agent's)."""
    args = {
        "owner": dataclasses.asdict(agent.state.owner()),
        "work_dir": str(agent.work.dir),
        "workdir": str(agent.work.attempt_dir(data["job"], data["attempt"])),
        "assignment": data,
        "window": window,
    }
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_AGENT, json.dumps(args)], env=env, timeout=60, cwd=ROOT
    )
    assert done.returncode == -signal.SIGKILL


def copies_of(path: Path) -> list[int]:
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


@pytest.fixture
def copies(tmp_path):
    """The file each copy of the job writes its pid into; what runs of them killed at the end."""
    path = tmp_path / "copies"
    yield path
    for pid in copies_of(path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def test_an_agent_killed_before_the_pid_file_leaves_nothing_to_run_twice(
    agent, control_plane, copies
):
    """Killed after the process started and before its pid file was written: the process only
    waited on the agent, and exits without running the command. The next agent finds no pid
    file and launches the `starting` attempt again: one copy of the job ran, not two (the
    first ran on unrecorded in its own session)."""
    agent.start()
    data = assignment(21, ["sh", "-c", f"echo $$ >> {copies}; sleep 1"])
    launch_and_kill(agent, data, "_record")
    time.sleep(1)  # a copy the killed agent left would have written its pid by now
    assert copies_of(copies) == []
    assert agent.runtimes["process"].find() == []
    control_plane.assignments = [data | {"state": "starting"}]  # its `starting` was taken
    agent.reconcile()  # what the next agent does first
    wait_for(lambda: control_plane.steps(21)[-1:] == [("succeeded", "")])
    assert [step for step, _ in control_plane.steps(21)].count("starting") == 1  # relaunched
    assert len(copies_of(copies)) == 1


def test_an_agent_killed_after_the_pid_file_leaves_one_copy_that_the_next_adopts(
    agent, control_plane, copies
):
    """Killed once the pid file was written, before its word to go: the process runs the
    command (its record is there) and the next agent adopts it by its pid; it launches
    nothing again."""
    agent.start()
    data = assignment(22, ["sh", "-c", f"echo $$ >> {copies}; sleep 2"])
    launch_and_kill(agent, data, "_release")
    wait_for(lambda: len(copies_of(copies)) == 1)
    [found] = agent.runtimes["process"].find()
    assert (found.job, found.running, found.handle.pid) == (22, True, copies_of(copies)[0])
    control_plane.assignments = [data | {"state": "starting"}]
    agent.reconcile()
    runner = agent.runners[(22, 220)]
    runner.join(20)
    assert not runner.is_alive()
    # adopted (its exit status is lost with the agent that started it), never launched again
    assert control_plane.steps(22) == [("running", ""), ("failed", "runtime_error")]
    assert len(copies_of(copies)) == 1
