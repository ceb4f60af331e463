"""Builders and fixtures for the lease tests: small pools with exact capacity, built through
the services."""

import uuid

import pytest

from leases import selectors
from nodes.services import node_mark_ready, node_register, node_verify
from pools.actors import Actor
from pools.choices import TenantRole
from pools.services import membership_set, pool_create, tenant_create

SYSTEM = Actor.system("tests")


def make_pool(slug="leases", **fields):
    """allocatable == raw: no system reserve, no safety margin."""
    return pool_create(
        name=f"Pool {slug}",
        slug=slug,
        system_reserve_cpu_millicores=0,
        system_reserve_memory_mib=0,
        safety_margin_percent=0,
        **fields,
    )


def make_node(pool, name, *, cpu=4000, memory=8192, scratch=0, gpus=(), labels=None, ready=True):
    gpu_rows = [
        {
            "index": i,
            "uuid": f"GPU-{uuid.uuid4()}",
            "model": g.get("model", "A100-80GB"),
            "memory_mib": g.get("memory_mib", 81920),
            "mig_enabled": g.get("mig", False),
            "sharing_mode": g.get("sharing", "exclusive"),
        }
        for i, g in enumerate(gpus)
    ]
    node = node_register(
        pool=pool,
        name=name,
        actor=SYSTEM,
        cpu_millicores=cpu,
        memory_mib=memory,
        scratch_mib=scratch,
        gpus=gpu_rows,
        labels=labels or {},
    )
    if ready:
        node = node_verify(node=node, actor=SYSTEM)
        node = node_mark_ready(node=node, actor=SYSTEM)
    return node


def cpu_request(cpu=1000, memory=1024, scratch=0, **extra):
    return {
        "cpu_millicores_min": cpu,
        "memory_mib_min": memory,
        "scratch_mib": scratch,
        "gpu_sharing_class": "none",
        "gpu_count": 0,
        **extra,
    }


def gpu_request(sharing="exclusive", count=1, milli=0, mig_profile="", cpu=1000, memory=1024):
    return cpu_request(
        cpu,
        memory,
        gpu_sharing_class=sharing,
        gpu_count=count,
        gpu_milli=milli,
        mig_profile=mig_profile,
    )


def assert_ledger_ok(pool=None):
    problems = selectors.ledger_problems(pool)
    assert problems == [], problems


@pytest.fixture
def system_actor():
    return SYSTEM


@pytest.fixture
def lpool(db):
    return make_pool()


@pytest.fixture
def ltenant(db):
    return tenant_create(name="Lease tenant", slug="lt")


@pytest.fixture
def ltenant2(db):
    return tenant_create(name="Lease tenant 2", slug="lt2")


@pytest.fixture
def lnode(lpool):
    return make_node(lpool, "n1", cpu=4000, memory=8192, scratch=10_000)


@pytest.fixture
def lmember(ltenant, django_user_model):
    user = django_user_model.objects.create_user(username="lmember", password="x")
    membership_set(user=user, tenant=ltenant, role=TenantRole.MEMBER)
    return user


@pytest.fixture
def loutsider(ltenant2, django_user_model):
    user = django_user_model.objects.create_user(username="loutsider", password="x")
    membership_set(user=user, tenant=ltenant2, role=TenantRole.MEMBER)
    return user


@pytest.fixture
def loperator(db, django_user_model):
    from pools.choices import PlatformRole
    from pools.services import platform_role_grant

    user = django_user_model.objects.create_user(username="loperator", password="x")
    platform_role_grant(user=user, role=PlatformRole.OPERATOR)
    return user


def api_client(user=None, scopes=("read", "write"), node=None):
    """A bearer-token client for a person, a node's agent (its own credential), or anonymous."""
    from rest_framework.test import APIClient

    from nodes.services import node_credential_issue
    from pools.services import api_token_issue

    client = APIClient()
    if node is not None:
        _, secret = node_credential_issue(node=node)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    elif user is not None:
        _, secret = api_token_issue(user=user, name="t", scopes=list(scopes))
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client
