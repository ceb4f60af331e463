"""The data-plane attacks run on the real Docker engine (tests/security/dataplane.py), through
the agent tests' engine fixture (those tests stand alone, without the control plane's conftest)."""

from tests.worker_agent.conftest import docker_client  # noqa: F401
