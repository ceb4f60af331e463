"""Fixtures of the agent's tests: the real Docker engine and the busybox test image in the
loopback registry (by digest), and a small HTTP server standing in for the control plane's
agent API (it records what the agent sends). Outside CI a missing engine skips the docker
tests; in CI (CI=true) it fails them: nothing real is skipped there."""

from __future__ import annotations

import itertools
import os
import random
import urllib.request
import uuid

import pytest

from worker_agent.agent import Agent, Config
from worker_agent.client import ApiClient
from worker_agent.runtime import disks
from worker_agent.runtime.base import Owner
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.state import AgentState

from .control_plane import ControlPlane

IN_CI = os.environ.get("CI", "").lower() == "true"
# Job, lease and probe numbers of these tests name containers and volumes on the one engine
# that every test process shares: a random start per process (not the clock, which two xdist
# workers read in the same second) and steps of 10 (a test's lease is its job + 7).
IDS = itertools.count(random.SystemRandom().randrange(10**6, 2 * 10**9, 10), 10)
REGISTRY = "127.0.0.1:5000"
REPO = "computepool/busybox"
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)
# The Docker runtime has no pause image of its own (a node names one); these tests give it the
# busybox test image, as `make run` does. Set before any runtime is made.
PAUSE_IMAGE = f"{REGISTRY}/{REPO}:test"
os.environ.setdefault("WORKER_AGENT_PAUSE_IMAGE", PAUSE_IMAGE)


def make_owner(node_name: str = "test-node") -> Owner:
    """An owner of its own (a fresh control plane): a test sees only its own containers."""
    return Owner(str(uuid.uuid4()), next(IDS), node_name)


def require_service(available: bool, what: str):
    """Outside CI a missing local service skips; in CI nothing real is ever skipped."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} is not available here")


@pytest.fixture(scope="session")
def docker_client():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        require_service(False, f"the Docker engine ({exc}); run .ci/ensure-services.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_image(docker_client) -> str:
    """The busybox test image by digest, as the control plane would send it."""
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{REPO}/manifests/test", method="HEAD")
    request.add_header("Accept", MANIFEST_TYPES)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            digest = response.headers["Docker-Content-Digest"]
    except OSError as exc:
        require_service(False, f"the test image in {REGISTRY} ({exc})")
    return f"{REGISTRY}/{REPO}@{digest}"


@pytest.fixture
def control_plane():
    server = ControlPlane()
    yield server
    server.close()


@pytest.fixture
def agent_parts(tmp_path, control_plane, docker_client):
    """A runner's parts: state with a credential, an API client, the Docker runtime."""
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": control_plane.credential})
    client = ApiClient(control_plane.url, state, backoff=0.01)
    return state, client, DockerRuntime(make_owner(), client=docker_client)


@pytest.fixture
def workdir(tmp_path):
    """An attempt's directory: inputs the container's non-root user may read (/outputs and
    /scratch are the runtime's filesystems, unmounted at the end)."""
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs").chmod(0o777)
    yield tmp_path
    disks.release(tmp_path)


@pytest.fixture
def agent(tmp_path, control_plane):
    """An agent on the process runtime, enrolling with the fake control plane."""
    config = Config(api=control_plane.url, state_dir=str(tmp_path / "state"), enroll_token="cpe_x")
    config.node_name, config.poll_s = "node-a", 0.1
    agent = Agent(
        config, runtimes={"process": ProcessRuntime(make_owner(), tmp_path / "state.work")}
    )
    yield agent
    agent.stop()
    agent.shutdown()
