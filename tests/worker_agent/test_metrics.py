"""The agent's own /metrics (worker_agent/metrics.py), on a local port when enabled: heartbeat
age, the assignment's lag from its lease, pull and start times, the workloads it runs."""

import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from worker_agent.agent import Agent, Config
from worker_agent.runtime.process import ProcessRuntime

from .conftest import make_owner
from .test_agent import assignment, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_for(tmp_path, control_plane, metrics_port: int) -> Agent:
    config = Config(
        api=control_plane.url,
        state_dir=str(tmp_path / "state"),
        enroll_token="cpe_x",
        node_name="node-metrics",
        poll_s=0.2,
        push=False,
        metrics_port=metrics_port,
    )
    return Agent(config, runtimes={"process": ProcessRuntime(make_owner(), tmp_path / "w")})


@pytest.fixture
def running(tmp_path, control_plane):
    started = []

    def start(metrics_port: int) -> Agent:
        agent = agent_for(tmp_path, control_plane, metrics_port)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread))
        return agent

    yield start
    for agent, thread in started:
        agent.stop()
        thread.join(20)


def scrape(port: int) -> dict:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_agent_serves_its_own_metrics_when_asked(running, control_plane):
    port = free_port()
    leased = datetime.now(UTC) - timedelta(seconds=3)
    control_plane.assignments = [assignment(41, ["true"], leased_at=leased.isoformat())]
    running(metrics_port=port)
    wait_for(lambda: control_plane.steps(41)[-1:] == [("succeeded", "")])
    samples = scrape(port)
    assert 0 <= samples[("computepool_agent_heartbeat_age_seconds", ())] < 30
    assert samples[("computepool_agent_assignment_lag_seconds_count", ())] == 1
    assert 3 <= samples[("computepool_agent_assignment_lag_seconds_sum", ())] < 30
    assert samples[("computepool_agent_image_pull_seconds_count", ())] == 1
    assert samples[("computepool_agent_container_start_seconds_count", ())] == 1
    assert samples[("computepool_agent_containers", ())] >= 0


def test_metrics_are_off_by_default(tmp_path, control_plane):
    agent = agent_for(tmp_path, control_plane, metrics_port=0)
    agent.start()
    try:
        assert agent.metrics.server is None
    finally:
        agent.stop()
        agent.shutdown()


def test_an_unreadable_lease_time_measures_no_lag(running, control_plane):
    port = free_port()
    control_plane.assignments = [assignment(42, ["true"], leased_at="yesterday-ish")]
    running(metrics_port=port)
    wait_for(lambda: control_plane.steps(42)[-1:] == [("succeeded", "")])
    time.sleep(0.1)
    assert scrape(port)[("computepool_agent_assignment_lag_seconds_count", ())] == 0
