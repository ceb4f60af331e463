"""A gVisor job end to end (tests/e2e/conftest.py): the real agent finds dockerd's runsc runtimes
(.ci/ensure-services.sh registers them), offers `gvisor`, and a job whose request asks for it
runs under runsc on the real engine: its log shows gVisor's kernel, not the host's, and its
outputs come back as a Docker job's do. One job without a network, one on the pool network."""

from __future__ import annotations

import platform
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.conftest import require_service
from worker_agent.runtime.docker import POOL_NETWORK, DockerRuntime

pytestmark = pytest.mark.docker

SANDBOX_KERNEL = "4.4.0"  # what gVisor's Sentry answers to uname
GVISOR = {"cpu_millicores_min": 100, "memory_mib_min": 64, "container_runtime": "gvisor"}


@pytest.fixture(autouse=True)
def offers_gvisor(stack):
    node = stack.node()
    require_service("gvisor" in node.runtimes, "gVisor on the e2e agent's node (runsc in dockerd)")
    return node


def running_container(stack, job_id: int):
    """The job's container while it runs, as the engine shows it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for container in stack.containers(job_id):
            container.reload()
            if container.labels.get("computepool.role") != "network":
                return container
        time.sleep(0.2)
    pytest.fail(f"no container for job {job_id}")


def test_a_gvisor_job_without_network_runs_on_gvisors_kernel(stack):
    script = (
        "busybox uname -r; busybox dmesg | busybox head -n 1; "
        "busybox uname -r > /outputs/kernel.txt; sleep 2"
    )
    response = stack.submit(
        "sandboxed", ["sh", "-c", script], resources=GVISOR, network_policy={"mode": "none"}
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    stack.drive(job_id, "running")
    host = running_container(stack, job_id).attrs["HostConfig"]
    assert host["Runtime"] == "runsc-none" and host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True and host["Memory"] == 64 * 1024 * 1024

    job = stack.drive(job_id, "succeeded")
    assert job["exit_code"] == 0
    kernel, dmesg = stack.api("GET", f"jobs/{job_id}/logs").text.splitlines()[:2]
    assert kernel == SANDBOX_KERNEL != platform.release()
    assert "Starting gVisor" in dmesg
    download = stack.api("GET", f"jobs/{job_id}/outputs/kernel.txt")
    assert download.status_code == 200 and download.content == b"4.4.0\n"
    # removed right after its final report (the agent reports first)
    stack.drive(job_id, lambda job: stack.containers(job_id) == [], timeout=10)


@pytest.fixture
def host_server(stack):
    """An HTTP server of this test on every host address, and the pool network's gateway: where
    a pool job would reach it if its egress rules let it (they do not: nothing is allowed)."""
    DockerRuntime(client=stack.docker).networks.pool_network()  # as the agent makes it
    network = stack.docker.networks.get(POOL_NETWORK)
    server = ThreadingHTTPServer(("0.0.0.0", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield network.attrs["IPAM"]["Config"][0]["Gateway"], server.server_port
    server.shutdown()
    server.server_close()


def test_a_gvisor_job_on_the_pool_network_serves_its_port_and_reaches_nothing_else(
    stack, host_server
):
    gateway, port = host_server
    script = (
        "busybox uname -r; echo sandboxed > /tmp/index.html; "
        f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 3 busybox nc {gateway} {port}; "
        "echo egress=$?; busybox httpd -f -p 8080 -h /tmp"
    )
    response = stack.submit(
        "sandboxed-server",
        ["sh", "-c", script],
        resources=GVISOR,
        ports=[8080],
        network_policy={"mode": "pool", "egress_allow": []},
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = stack.drive(job_id, lambda job: job["state"] == "running" and job["route"])
    assert running_container(stack, job_id).attrs["HostConfig"]["Runtime"] == "runsc-netns"
    published = job["route"]["ports"]["8080"]
    deadline = time.monotonic() + 20
    while "egress=" not in (logs := stack.api("GET", f"jobs/{job_id}/logs").text):
        assert time.monotonic() < deadline, logs
        stack.drive(job_id, "running")
    assert logs.splitlines()[0] == SANDBOX_KERNEL
    assert "egress=0" not in logs and "HTTP/1.0 200" not in logs
    # what listens in the sandbox is reached through the route, like a Docker job's port (once
    # httpd, started after the log line, listens: until then the engine's proxy hangs up)
    url = f"http://{job['route']['host']}:{published}/"
    while True:
        try:
            served = requests.get(url, timeout=5)
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline + 10, f"nothing answers on {url}"
            time.sleep(0.2)
    assert served.status_code == 200 and served.text == "sandboxed\n"

    assert stack.api("POST", f"jobs/{job_id}/cancel").status_code == 200
    stack.drive(job_id, lambda job: stack.containers(job_id) == [], timeout=20)
