"""The runtime contract (worker_agent/runtime/protocol.py): every runtime the agent offers has
each of its members with the contract's parameters, and is a `Runtime` as made; the Docker
runtime is not made without a pause image (no test image as a production default)."""

import inspect

import pytest

from worker_agent.agent import AgentError, make_runtimes
from worker_agent.runtime.base import RuntimeUnconfigured
from worker_agent.runtime.docker import DockerRuntime, GVisorRuntime
from worker_agent.runtime.process import ProcessHandle, ProcessRuntime
from worker_agent.runtime.protocol import LogStream, Runtime
from worker_agent.workroot import WorkRoot

from .conftest import make_owner, require_service

RUNTIMES = [DockerRuntime, GVisorRuntime, ProcessRuntime]
METHODS = sorted(
    name for name, member in vars(Runtime).items() if inspect.isfunction(member) and name[0] != "_"
)
ATTRIBUTES = sorted(Runtime.__annotations__)


def parameters(function) -> list[tuple]:
    """What a caller relies on: how many positional parameters, each optional one by its name
    and default (the handle is named as each runtime likes: a container, a process)."""
    return [
        (p.kind, p.name if p.default is not p.empty else "", p.default)
        for p in inspect.signature(function).parameters.values()
    ]


def test_the_contract_names_what_the_runner_asks_for():
    assert METHODS == [
        "archive",
        "create",
        "find",
        "images",
        "logs",
        "ports",
        "pull",
        "remove",
        "signal",
        "start",
        "stats",
        "stop",
        "unpack",
        "wait",
    ]
    assert ATTRIBUTES == ["bounds_disks", "name", "owner"]


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda cls: cls.__name__)
def test_each_runtime_has_every_member_with_the_contracts_parameters(runtime):
    for name in METHODS:
        assert parameters(getattr(runtime, name)) == parameters(getattr(Runtime, name)), name
    assert isinstance(runtime.name, str) and isinstance(runtime.bounds_disks, bool)


def test_the_process_runtime_is_a_runtime(tmp_path):
    runtime = ProcessRuntime(make_owner(), tmp_path)
    assert isinstance(runtime, Runtime)
    assert isinstance(runtime.logs(ProcessHandle(workdir=tmp_path)), LogStream)


@pytest.mark.docker
def test_the_docker_runtimes_are_runtimes(docker_client):
    for runtime in (DockerRuntime, GVisorRuntime):
        made = runtime(make_owner(), client=docker_client)
        assert isinstance(made, Runtime) and made.owner is not None


def test_without_a_pause_image_the_docker_runtime_is_not_made(monkeypatch):
    monkeypatch.delenv("WORKER_AGENT_PAUSE_IMAGE", raising=False)
    with pytest.raises(RuntimeUnconfigured) as refused:
        DockerRuntime(make_owner(), client=object())
    assert "WORKER_AGENT_PAUSE_IMAGE" in str(refused.value)
    assert "--pause-image" in str(refused.value)
    made = DockerRuntime(
        make_owner(), client=object(), pause_image="registry/pause@sha256:" + "a" * 64
    )
    assert made.networks.pause_image == "registry/pause@sha256:" + "a" * 64


@pytest.mark.docker
def test_an_agent_with_docker_and_no_pause_image_does_not_start(tmp_path, monkeypatch):
    require_service(DockerRuntime.available(), "the Docker engine")
    monkeypatch.delenv("WORKER_AGENT_PAUSE_IMAGE", raising=False)
    work = WorkRoot(tmp_path / "work", tmp_path / "state")
    with pytest.raises(AgentError, match="WORKER_AGENT_PAUSE_IMAGE"):
        make_runtimes("docker", work)
    assert list(make_runtimes("process", work)) == ["process"]  # no engine asked for: no image
    assert "docker" in make_runtimes("docker", work, pause_image="127.0.0.1:5000/x:test")
