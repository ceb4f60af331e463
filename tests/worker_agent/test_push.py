"""Assignments pushed to the agent (docs/data-plane.md "Assignments"): the agent's run loop
against the fake control plane, whose long poll `agent/assignments/wait` answers at `push()`.
A push brings the next sync forward; a lost one (the wait never answers, or fails) costs at
most one poll; a push and a poll never start a job twice; an older control plane (404) is
polled only."""

import threading
import time

import pytest

from worker_agent.agent import Agent, Config
from worker_agent.runtime.process import ProcessRuntime

from .conftest import make_owner
from .test_agent import assignment


def wait_for(condition, timeout=20.0, step=0.01):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)
    return time.monotonic()


@pytest.fixture
def running(tmp_path, control_plane):
    """running(poll_s): an agent's whole run loop on a thread of its own, stopped at the end."""
    agents = []

    def start(poll_s: float, push: bool = True) -> Agent:
        config = Config(
            api=control_plane.url,
            state_dir=str(tmp_path / "state"),
            enroll_token="cpe_x",
            node_name="node-push",
            poll_s=poll_s,
            push=push,
        )
        config.heartbeat_interval_s = 600
        agent = Agent(
            config, runtimes={"process": ProcessRuntime(make_owner(), tmp_path / "state.work")}
        )
        agent.heartbeat_interval = 600  # enrollment sets 1 s: only the first heartbeat here
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        agents.append((agent, thread))
        # the reconcile's read at start, then the loop's first sync: it waits from here on
        wait_for(lambda: len(control_plane.sent("agent/assignments")) >= 2)
        return agent

    yield start
    for agent, thread in agents:
        agent.stop()
        thread.join(20)


def syncs(control_plane) -> int:
    return len(control_plane.sent("agent/assignments"))


def starts(control_plane, job) -> int:
    return [step for step, _ in control_plane.steps(job)].count("starting")


def test_a_push_syncs_at_once_instead_of_after_poll_s(running, control_plane):
    running(poll_s=30)
    wait_for(lambda: control_plane.waiting == 1)
    before = syncs(control_plane)
    control_plane.assignments = [assignment(31, ["true"])]
    pushed = time.monotonic()
    control_plane.push()
    synced = wait_for(lambda: syncs(control_plane) > before, timeout=5)
    assert synced - pushed < 1.0  # not the 30 s poll
    wait_for(lambda: control_plane.steps(31)[-1:] == [("succeeded", "")], timeout=5)
    assert starts(control_plane, 31) == 1
    wait_for(lambda: control_plane.waiting == 1)  # and it waits for the next one


@pytest.mark.parametrize("mode", ["lost", "error"])
def test_a_lost_push_is_caught_by_the_next_poll_and_started_exactly_once(
    running, control_plane, mode
):
    """The wait never answers (a push lost on its way) or fails: the job still starts at the
    next poll, once, and is not started again by the polls after it."""
    control_plane.wait_mode = mode
    running(poll_s=1.0)
    control_plane.assignments = [assignment(32, ["true"])]
    pushed = time.monotonic()
    control_plane.push()  # nobody hears it
    started = wait_for(lambda: starts(control_plane, 32) == 1, timeout=5)
    assert started - pushed < 1.0 + 1.5  # the next poll, not later
    wait_for(lambda: control_plane.steps(32)[-1:] == [("succeeded", "")])
    polls = syncs(control_plane)
    wait_for(lambda: syncs(control_plane) >= polls + 2, timeout=5)  # still listed: not rerun
    assert starts(control_plane, 32) == 1
    if mode == "error":  # retried with a backoff, never in a tight loop
        assert 1 <= len(control_plane.sent("wait?timeout=25.0")) <= 6


def test_a_push_and_a_poll_never_start_a_job_twice(running, control_plane):
    running(poll_s=0.05)
    control_plane.assignments = [assignment(33, ["sleep", "1"])]
    for _ in range(20):  # pushes racing the polls
        control_plane.push()
        time.sleep(0.02)
    wait_for(lambda: control_plane.steps(33)[-1:] == [("succeeded", "")])
    for _ in range(5):
        control_plane.push()
        time.sleep(0.05)
    assert starts(control_plane, 33) == 1


def test_an_older_control_plane_without_the_wait_is_polled(running, control_plane):
    control_plane.wait_mode = "missing"
    agent = running(poll_s=0.2)
    wait_for(lambda: agent.push_thread is not None and not agent.push_thread.is_alive())
    control_plane.assignments = [assignment(34, ["true"])]
    wait_for(lambda: control_plane.steps(34)[-1:] == [("succeeded", "")], timeout=5)
    assert len(control_plane.sent("wait?timeout=25.0")) == 1  # asked once, then polls only


def test_without_push_the_agent_never_waits(running, control_plane):
    running(poll_s=0.2, push=False)
    polls = syncs(control_plane)
    wait_for(lambda: syncs(control_plane) >= polls + 2)
    assert control_plane.sent("wait?timeout=25.0") == []
