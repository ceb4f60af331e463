from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.test import APIRequestFactory

from config.builders import SYSTEM
from nodes import services
from nodes.authentication import NodeCredentialAuthentication
from nodes.models import NodeCredential
from pools.actors import Actor, NodePrincipal
from pools.roles import is_operator, tenant_roles
from tests.clients import SignedFactory, node_key

pytestmark = pytest.mark.django_db
factory = APIRequestFactory()


def authenticate(header):
    """The authentication of GET agent/me with `header`, signed by the node's key when the
    credential in it is one of a node this test bound a key to (as its agent signs)."""
    key = node_key(header.partition(" ")[2])
    signer = SignedFactory(key) if key is not None else factory
    request = signer.get("/api/v1/agent/me/", HTTP_AUTHORIZATION=header)
    return NodeCredentialAuthentication().authenticate(request)


def test_valid_credential_gives_a_node_principal(ready_node):
    principal, credential = authenticate(f"Bearer {ready_node.secret}")
    assert isinstance(principal, NodePrincipal)
    assert principal.node == ready_node.node and credential == ready_node.credential
    assert principal.is_authenticated is True and principal.is_anonymous is False
    assert principal.pk is None
    assert principal.get_username() == f"node:{ready_node.node.name}"
    # the role helpers see no role and no tenant, without touching the database
    assert is_operator(principal) is False and tenant_roles(principal) == {}
    actor = Actor.for_user(principal)
    assert (actor.kind, actor.label, actor.node) == (
        "node",
        principal.get_username(),
        principal.node,
    )
    assert actor.is_node and not actor.is_person and actor.user_id is None


@pytest.mark.parametrize("header", ["", "Bearer cpu_persontoken", "Token cpn_x", "Basic abc"])
def test_other_schemes_are_left_to_other_authenticators(header):
    assert authenticate(header) is None


def test_refusals(ready_node, operator):
    with pytest.raises(AuthenticationFailed, match="unknown"):
        authenticate("Bearer cpn_doesnotexist")
    NodeCredential.objects.filter(pk=ready_node.credential.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(AuthenticationFailed, match="expired"):
        authenticate(f"Bearer {ready_node.secret}")
    _, secret = services.node_credential_reissue(node=ready_node.node, actor=SYSTEM)
    assert authenticate(f"Bearer {secret}")[0].node == ready_node.node
    services.node_credentials_revoke(node=ready_node.node, actor=Actor.for_user(operator))
    with pytest.raises(AuthenticationFailed, match="revoked"):
        authenticate(f"Bearer {secret}")


def test_rotated_credential_valid_only_during_overlap(ready_node):
    now = timezone.now()
    _, secret = services.node_credential_rotate(
        credential=ready_node.credential, actor=SYSTEM, now=now - timedelta(minutes=11)
    )
    with pytest.raises(AuthenticationFailed, match="rotated"):
        authenticate(f"Bearer {ready_node.secret}")
    assert authenticate(f"Bearer {secret}")[0].node == ready_node.node


def test_retired_node_cannot_authenticate(ready_node):
    NodeCredential.objects.filter(node=ready_node.node).update(revoked_at=None)
    services.node_retire(node=ready_node.node, actor=SYSTEM)
    NodeCredential.objects.filter(node=ready_node.node).update(revoked_at=None)
    with pytest.raises(AuthenticationFailed, match="retired"):
        authenticate(f"Bearer {ready_node.secret}")


def test_last_used_is_written_at_most_once_a_minute(ready_node):
    authenticate(f"Bearer {ready_node.secret}")
    first = NodeCredential.objects.get(pk=ready_node.credential.pk).last_used_at
    authenticate(f"Bearer {ready_node.secret}")
    assert NodeCredential.objects.get(pk=ready_node.credential.pk).last_used_at == first
