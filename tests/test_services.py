"""The real services that `.ci/ensure-services.sh` provides, checked over real connections.

No mocks and no Django database: these tests talk to PostgreSQL, Redis, the Docker engine,
the loopback registry, gVisor and Chromium exactly as the rest of the suite will. When one fails,
run `.ci/ensure-services.sh` (as root) and read its line for that service.
"""

import hashlib
import json
import subprocess
import urllib.request
from pathlib import Path

import docker
import psycopg
import pytest
import redis

REGISTRY = "127.0.0.1:5000"
TEST_IMAGE_REPO = "computepool/busybox"
TEST_IMAGE_TAG = "test"
MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.manifest.v1+json"
)
HINT = "run .ci/ensure-services.sh"


def registry_get(path: str, method: str = "GET", accept: str | None = None):
    request = urllib.request.Request(f"http://{REGISTRY}{path}", method=method)
    if accept:
        request.add_header("Accept", accept)
    return urllib.request.urlopen(request, timeout=5)


@pytest.fixture(scope="module")
def docker_client():
    client = docker.from_env(timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def test_image_digest() -> str:
    """The manifest digest of the busybox test image, as the registry reports it."""
    with registry_get(
        f"/v2/{TEST_IMAGE_REPO}/manifests/{TEST_IMAGE_TAG}", accept=MANIFEST_TYPES
    ) as response:
        digest = response.headers["Docker-Content-Digest"]
    assert digest, f"registry gave no digest for {TEST_IMAGE_REPO}:{TEST_IMAGE_TAG}; {HINT}"
    return digest


def test_postgresql_accepts_a_connection():
    with psycopg.connect(
        host="127.0.0.1", port=5432, user="postgres", dbname="postgres", connect_timeout=5
    ) as conn:
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
        (version,) = conn.execute("SHOW server_version").fetchone()
    assert version


def test_redis_answers_ping():
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=5)
    try:
        assert client.ping() is True
    finally:
        client.close()


@pytest.mark.docker
def test_docker_engine_answers(docker_client):
    assert docker_client.ping() is True
    assert docker_client.version()["Version"]


@pytest.mark.docker
def test_registry_answers_v2():
    with registry_get("/v2/") as response:
        assert response.status == 200
        assert response.headers["Docker-Distribution-Api-Version"] == "registry/2.0"


@pytest.mark.docker
def test_registry_holds_busybox_image_by_digest(test_image_digest):
    assert test_image_digest.startswith("sha256:")
    # The digest resolves: fetching the manifest by digest returns exactly those bytes.
    with registry_get(
        f"/v2/{TEST_IMAGE_REPO}/manifests/{test_image_digest}", accept=MANIFEST_TYPES
    ) as response:
        body = response.read()
    assert "sha256:" + hashlib.sha256(body).hexdigest() == test_image_digest
    manifest = json.loads(body)
    assert manifest["schemaVersion"] == 2
    assert len(manifest["layers"]) == 1, "FROM scratch with one COPY gives one layer"


@pytest.mark.docker
def test_container_from_test_image_by_digest_runs(docker_client, test_image_digest):
    reference = f"{REGISTRY}/{TEST_IMAGE_REPO}@{test_image_digest}"
    docker_client.images.pull(reference)
    output = docker_client.containers.run(
        reference,
        ["sh", "-c", "echo hello; ls /bin"],
        remove=True,
        network_mode="none",
    )
    lines = output.decode().split()
    assert lines[0] == "hello"
    for applet in ("busybox", "sh", "sleep", "cat", "echo", "nproc", "free", "ls"):
        assert applet in lines[1:], f"/bin/{applet} missing from the test image"


@pytest.mark.docker
@pytest.mark.parametrize(
    ("runtime", "network"), [("runsc-none", "none"), ("runsc-netns", "bridge")]
)
def test_gvisor_runtimes_run_a_sandbox(docker_client, runtime, network):
    """Both dockerd runtimes of gVisor are loaded, and each starts gVisor's own kernel."""
    loaded = docker_client.info()["Runtimes"]
    assert runtime in loaded, f"dockerd has no runtime {runtime} ({sorted(loaded)}); {HINT}"
    output = docker_client.containers.run(
        f"{REGISTRY}/{TEST_IMAGE_REPO}:{TEST_IMAGE_TAG}",
        ["sh", "-c", "busybox uname -r; busybox dmesg"],
        runtime=runtime,
        network_mode=network,
        remove=True,
    )
    kernel, *dmesg = output.decode().splitlines()
    assert kernel == "4.4.0", "the host's kernel answered, not gVisor's"
    assert any("Starting gVisor" in line for line in dmesg)


def test_chromium_is_installed():
    chromium = Path("/usr/bin/chromium")
    assert chromium.is_file(), f"{chromium} missing; {HINT}"
    result = subprocess.run(
        [str(chromium), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Chromium" in result.stdout
