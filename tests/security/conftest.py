"""The data-plane attacks run on the real Docker engine (tests/security/dataplane.py)."""

import pytest

from tests.conftest import require_service


@pytest.fixture(scope="session")
def docker_client():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        require_service(False, f"the Docker engine ({exc})")
    yield client
    client.close()
