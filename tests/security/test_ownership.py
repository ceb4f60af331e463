"""Issue 17: two agents share one Docker engine (two control planes on one machine, or two nodes
of one). An agent finds, adopts and removes only the containers and volumes labelled with its
own control-plane id and node id, never one by its name alone: before, it filtered by node name
and removed a leftover by name, so two agents killed each other's jobs."""

import contextlib
import uuid

import pytest
from docker.errors import NotFound

from tests.worker_agent.conftest import IDS, docker_client, test_image  # noqa: F401 (fixtures)
from tests.worker_agent.control_plane import ControlPlane
from worker_agent.agent import Agent, Config
from worker_agent.runtime.base import Assignment, Owner, RuntimeFailure
from worker_agent.runtime.docker import INPUTS_SUFFIX, OWNER_SUFFIX, DockerRuntime

pytestmark = pytest.mark.docker

NODE = "shared-name"  # both agents' nodes are called so: a name proves nothing


def assignment(image: str) -> Assignment:
    job = next(IDS)
    return Assignment.parse(
        {
            "job": job,
            "lease": job + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["sleep", "300"],
            "limits": {"cpu_millicores": 100, "memory_mib": 32, "scratch_mib": 4, "pids": 16},
        }
    )


@pytest.fixture
def foreign(docker_client, test_image):  # noqa: F811 (fixtures imported above)
    """Starts another agent's container (and scratch volume) under a given name and labels;
    all are removed at the end by this test, which made them."""
    made = []

    def start(name: str, labels: dict, *, volume: bool = False):
        if volume:
            made.append(docker_client.volumes.create(name=f"{name}-scratch", labels=labels))
        container = docker_client.containers.run(
            test_image, ["sleep", "300"], name=name, labels=labels, detach=True
        )
        made.append(container)
        return container

    yield start
    for thing in reversed(made):
        with contextlib.suppress(NotFound):
            thing.remove(force=True)


def alive(container) -> bool:
    try:
        container.reload()
    except NotFound:
        return False
    return container.status == "running"


@pytest.mark.parametrize("other", ["another node", "another control plane"])
def test_a_clashing_container_of_another_owner_is_never_removed_nor_adopted(
    docker_client,  # noqa: F811
    test_image,  # noqa: F811
    foreign,
    tmp_path,
    other,
):
    """The attack: a container with exactly the name this agent would give its attempt, and its
    job/lease labels, but another owner's ids. The agent neither lists it, nor removes it as a
    "leftover", nor starts its own beside it: the attempt fails runtime_error."""
    mine = Owner(str(uuid.uuid4()), next(IDS), NODE)
    theirs = (
        Owner(mine.control_plane, mine.node_id + 1, NODE)
        if other == "another node"
        else Owner(str(uuid.uuid4()), mine.node_id, NODE)  # even the same node id
    )
    runtime = DockerRuntime(mine, client=docker_client)
    a = assignment(test_image)
    name = runtime.container_name(a)
    theirs_container = foreign(name, a.labels(theirs), volume=True)

    assert a.key not in {(f.job, f.lease) for f in runtime.find()}
    for workdir in ("outputs", "inputs"):
        (tmp_path / workdir).mkdir()
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create(a, tmp_path)
    assert refused.value.reason == "runtime_error" and "not this node's" in refused.value.message
    runtime.remove(theirs_container)  # a handle of someone else's: refused too
    assert alive(theirs_container)
    assert docker_client.volumes.get(f"{name}-scratch")  # its volume is left as well


@pytest.mark.parametrize("suffix", [OWNER_SUFFIX, INPUTS_SUFFIX])
def test_a_clashing_network_owner_of_another_node_is_left_alone(
    docker_client,  # noqa: F811
    test_image,  # noqa: F811
    foreign,
    tmp_path,
    suffix,
):
    """The same with the names of an attempt's network owners (its own namespace, and the
    throwaway one its inputs are fetched in)."""
    mine = Owner(str(uuid.uuid4()), next(IDS), NODE)
    runtime = DockerRuntime(mine, client=docker_client)
    a = assignment(test_image)
    labels = a.labels(Owner(mine.control_plane, mine.node_id + 1, NODE))
    theirs = foreign(runtime.container_name(a) + suffix, labels | {"computepool.role": "network"})
    for workdir in ("outputs", "inputs"):
        (tmp_path / workdir).mkdir()
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create(a, tmp_path)
    assert "not this node's" in refused.value.message
    runtime.find()  # its orphan sweep passes it by as well
    assert alive(theirs)


def test_a_whole_agent_reconciles_only_its_own_containers(
    docker_client,  # noqa: F811
    test_image,  # noqa: F811
    foreign,
    tmp_path,
):
    """Two agents' nodes with one name on one engine. Agent A starts, finds nothing assigned and
    removes what it owns; the containers of agent B (another control plane) and of another
    node of A's control plane, labelled with the same node name, keep running."""
    control_plane = ControlPlane()
    try:
        agent = Agent(
            Config(api=control_plane.url, state_dir=str(tmp_path / "a"), node_name=NODE),
            runtimes={"docker": DockerRuntime(client=docker_client)},
        )
        agent.state.save_credential({"credential": control_plane.credential})
        agent.enroll_if_needed()  # learns its node id and control-plane id (agent/me)
        mine = agent.state.owner()
        assert mine == Owner(control_plane.control_plane, control_plane.node_id, "test-node")
        a, b, c = (assignment(test_image) for _ in range(3))
        prefix = mine.prefix
        other_plane = foreign(
            f"{prefix}-job{a.job}-l{a.lease}",
            a.labels(Owner(str(uuid.uuid4()), mine.node_id, mine.node_name)),
        )
        other_node = foreign(
            f"{prefix}-job{b.job}-l{b.lease}{OWNER_SUFFIX}",
            b.labels(Owner(mine.control_plane, mine.node_id + 1, mine.node_name))
            | {"computepool.role": "network"},  # an orphaned-looking network owner
        )
        own_leftover = foreign(f"{prefix}-job{c.job}-l{c.lease}", c.labels(mine))
        agent.start()  # enrolls (resumes), sets the runtimes' owner, reconciles: none assigned
        assert alive(other_plane) and alive(other_node)
        assert not alive(own_leftover)  # its own, unassigned: removed
        agent.stop()
        agent.shutdown()
    finally:
        control_plane.close()
