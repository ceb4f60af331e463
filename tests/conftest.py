"""Shared fixtures: a pool, two tenants and one person per role, built through the services."""

import os

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from nodes.choices import NodeState
from nodes.services import node_mark_ready, node_register, node_verify
from pools.actors import Actor
from pools.choices import PlatformRole, TenantRole, TokenScope
from pools.models import AllowedRegistry, ResourceShape
from pools.services import (
    api_token_issue,
    membership_set,
    platform_role_grant,
    pool_create,
    tenant_create,
)

IN_CI = os.environ.get("CI", "").lower() == "true"


def require_service(available: bool, what: str):
    """Outside CI a missing local service skips; in CI nothing real is ever skipped."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} is not available here")


@pytest.fixture
def system():
    return Actor.system("tests")


@pytest.fixture
def pool(db):
    pool = pool_create(name="Test pool", slug="test")
    AllowedRegistry.objects.create(pool=pool, prefix="127.0.0.1:5000/computepool/")
    return pool


@pytest.fixture
def tenant(db):
    return tenant_create(name="Vision", slug="vision")


@pytest.fixture
def other_tenant(db):
    return tenant_create(name="Language", slug="nlp")


def make_user(username, **extra):
    return get_user_model().objects.create_user(username=username, password="pw-" + username)


@pytest.fixture
def member(tenant):
    user = make_user("member")
    membership_set(user=user, tenant=tenant, role=TenantRole.MEMBER)
    return user


@pytest.fixture
def tenant_admin(tenant):
    user = make_user("tadmin")
    membership_set(user=user, tenant=tenant, role=TenantRole.ADMIN)
    return user


@pytest.fixture
def outsider(other_tenant):
    user = make_user("outsider")
    membership_set(user=user, tenant=other_tenant, role=TenantRole.MEMBER)
    return user


@pytest.fixture
def operator(db):
    user = make_user("operator")
    platform_role_grant(user=user, role=PlatformRole.OPERATOR)
    return user


@pytest.fixture
def policy_admin(db):
    user = make_user("padmin")
    platform_role_grant(user=user, role=PlatformRole.POLICY_ADMIN)
    return user


def client_for(user, scopes=(TokenScope.READ, TokenScope.WRITE)):
    """An API client authenticated the way a CLI would be: a bearer token."""
    client = APIClient()
    if user is not None:
        _, secret = api_token_issue(user=user, name="test", scopes=list(scopes))
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def api():
    return client_for


@pytest.fixture
def cpu_shape(pool):
    return ResourceShape.objects.create(
        pool=pool, name="cpu-small", cpu_millicores_min=1000, memory_mib_min=1024
    )


@pytest.fixture
def ready_node(pool, system):
    node = node_register(
        pool=pool,
        name="node-1",
        actor=system,
        cpu_millicores=16000,
        memory_mib=65536,
        scratch_mib=100_000,
    )
    node = node_verify(node=node, actor=system)
    node = node_mark_ready(node=node, actor=system)
    assert node.state == NodeState.READY
    return node
