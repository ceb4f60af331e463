"""Shared fixtures, built by config.builders: a pool, two tenants and one person per role; the
lease tests' pool with exact capacity (`l…`); pools that nodes enroll into."""

import os

import pytest

from config.builders import (
    SYSTEM,
    TEST_IMAGE_TAG,
    Enrolled,
    build_node,
    build_person,
    build_pool,
    build_tenant,
    enroll_node,
    gpu_inventory,
)
from nodes import services as node_services
from nodes.choices import NodeState
from pools.actors import Actor
from pools.choices import PlatformRole, TenantRole, TrustLevel
from pools.models import ResourceShape
from tests.clients import client_for
from worker_agent.runtime import disks

IN_CI = os.environ.get("CI", "").lower() == "true"
# The Docker runtime's pause image has no default (a node names one): the tests, and the agents
# they start, use the busybox test image, as `make run` does.
os.environ.setdefault("WORKER_AGENT_PAUSE_IMAGE", TEST_IMAGE_TAG)


@pytest.fixture(scope="session", autouse=True)
def no_loop_mounts_left(tmp_path_factory):
    """Disk limits are filesystems loop-mounted below a test's directory (worker_agent/runtime/
    disks.py). Whatever a test left mounted there is unmounted when its session ends, so runs
    never leak loop devices (nor leave pytest directories it cannot delete)."""
    yield
    if os.geteuid() == 0:
        disks.release(tmp_path_factory.getbasetemp())


def require_service(available: bool, what: str):
    """Outside CI a missing local service skips; in CI nothing real is ever skipped."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} is not available here")


@pytest.fixture
def system():
    return SYSTEM


@pytest.fixture
def pool(db):
    return build_pool("test", name="Test pool")


@pytest.fixture
def tenant(db):
    return build_tenant("vision", name="Vision")


@pytest.fixture
def other_tenant(db):
    return build_tenant("nlp", name="Language")


@pytest.fixture
def member(tenant):
    return build_person("member", tenant=tenant)


@pytest.fixture
def tenant_admin(tenant):
    return build_person("tadmin", tenant=tenant, role=TenantRole.ADMIN)


@pytest.fixture
def outsider(other_tenant):
    return build_person("outsider", tenant=other_tenant)


@pytest.fixture
def operator(db):
    return build_person("operator", platform_role=PlatformRole.OPERATOR)


@pytest.fixture
def policy_admin(db):
    return build_person("padmin", platform_role=PlatformRole.POLICY_ADMIN)


@pytest.fixture
def shape_admin(db):
    return build_person("sadmin", platform_role=PlatformRole.SHAPE_ADMIN)


@pytest.fixture
def api():
    """client_for(user, scopes): an API client holding a bearer token of `user`."""
    return client_for


@pytest.fixture
def cpu_shape(pool):
    # No service for shapes: a policy admin edits them in the admin.
    return ResourceShape.objects.create(
        pool=pool, name="cpu-small", cpu_millicores_min=1000, memory_mib_min=1024
    )


@pytest.fixture
def ready_node(pool):
    node = build_node(pool, "node-1", cpu=16000, memory=65536, scratch=100_000)
    assert node.state == NodeState.READY
    return node


# The lease tests' world: allocatable == raw, so a node fills to the last millicore.
@pytest.fixture
def lpool(db):
    return build_pool("leases", exact_capacity=True)


@pytest.fixture
def ltenant(db):
    return build_tenant("lt", name="Lease tenant")


@pytest.fixture
def ltenant2(db):
    return build_tenant("lt2", name="Lease tenant 2")


@pytest.fixture
def lnode(lpool):
    return build_node(lpool, "n1", cpu=4000, memory=8192, scratch=10_000)


@pytest.fixture
def lmember(ltenant):
    return build_person("lmember", tenant=ltenant)


@pytest.fixture
def loutsider(ltenant2):
    return build_person("loutsider", tenant=ltenant2)


@pytest.fixture
def loperator(db):
    return build_person("loperator", platform_role=PlatformRole.OPERATOR)


# Pools that nodes enroll into through the token path, as their agents do.
@pytest.fixture
def private_pool(db):
    return build_pool("private", name="Private", registry=None)


@pytest.fixture
def market_pool(db):
    return build_pool("market", name="Market", registry=None, trust_level=TrustLevel.MARKETPLACE)


@pytest.fixture
def enroll(db, operator):
    """enroll(pool, name=…, gpus=2, now=…, **fields): an `Enrolled` node with unique GPUs."""
    counter = {"n": 0}

    def make(pool, *, name=None, gpus=2, now=None, **fields):
        counter["n"] += 1
        n = counter["n"]
        return enroll_node(
            pool,
            name or f"node-{n}",
            actor=Actor.for_user(operator),
            inventory=gpu_inventory(gpus=gpus, uuid_tag=f"{n:04d}"),
            now=now,
            **fields,
        )

    return make


@pytest.fixture
def agent(enroll, private_pool) -> Enrolled:
    """A private-fleet node with two GPUs, made ready by its agent's first heartbeat."""
    enrolled = enroll(private_pool)
    actor = Actor.for_node(enrolled.node)
    enrolled.node = node_services.node_heartbeat(node=enrolled.node, actor=actor)
    return enrolled
