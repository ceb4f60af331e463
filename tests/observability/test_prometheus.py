"""A real Prometheus (Debian's package, started here) scrapes the live server's /metrics with
a scrape token, and its query API returns what a job did."""

import shutil
import socket
import subprocess
import time

import pytest
import requests

from config.builders import build_token, submit_job
from observability.fold import fold
from tests.clients import bearer_client
from tests.conftest import require_service
from tests.jobs.test_agent_api import place, report, run

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path, live_server, operator):
    binary = shutil.which("prometheus")
    require_service(binary is not None, "prometheus (Debian's package)")
    token = tmp_path / "token"
    token.write_text(build_token(operator, scopes=["metrics:read"]))
    target = live_server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: computepool
    authorization: {{type: Bearer, credentials_file: {token}}}
    static_configs: [{{targets: ["{target}"]}}]
"""
    )
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


def query(prometheus: str, promql: str, until: float) -> list:
    """The query's result once it has one (Prometheus starts, then scrapes every second)."""
    while True:
        try:
            answer = requests.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5)
            if answer.ok and (result := answer.json()["data"]["result"]):
                return result
        except requests.ConnectionError:
            pass
        if time.monotonic() > until:
            return []
        time.sleep(0.5)


def test_prometheus_scrapes_a_job_s_counts(prometheus, agent, tenant):
    node_api = bearer_client(agent.secret)
    for exit_code, step in ((0, "succeeded"), (3, "failed")):
        job, lease = place(submit_job(agent.node.pool, tenant))
        run(node_api, job, lease)
        body = {"exit_code": exit_code} | ({"reason": "exited_nonzero"} if exit_code else {})
        assert report(node_api, job, lease, step, **body).status_code == 200
    fold()
    until = time.monotonic() + 60
    exits = query(prometheus, 'computepool_job_exits_total{pool="private"}', until)
    assert {r["metric"]["reason"]: r["value"][1] for r in exits} == {
        "exited_zero": "1",
        "exited_nonzero": "1",
    }
    waits = query(prometheus, "computepool_job_queue_wait_seconds_count", until)
    assert [(r["metric"]["tenant"], r["value"][1]) for r in waits] == [("vision", "2")]
    [up] = query(prometheus, 'up{job="computepool"}', until)
    assert up["value"][1] == "1"  # the scrape token was accepted
