"""Node credentials: rotation, expiry, reissue, revocation (nodes/services/credentials.py)."""

from datetime import timedelta

import pytest

from config.builders import SYSTEM
from nodes import services
from pools.actors import Actor
from pools.models import token_digest
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

from .conftest import last_event


def test_credential_rotation_overlap(ready_node, now):
    old = ready_node.credential
    new, secret = services.node_credential_rotate(
        credential=old, actor=Actor.for_node(ready_node.node), now=now
    )
    assert secret.startswith("cpn_") and new.digest == token_digest(secret)
    old.refresh_from_db()
    assert old.replaced_by == new
    assert old.valid_until == now + timedelta(minutes=10)
    # both valid inside the overlap, only the new one after it
    assert services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=9))[0]
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=9))[0]
    assert services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=10)) == (
        None,
        "credential rotated",
    )
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=11))[0] == new
    assert last_event(ready_node.node).reason == Reason.CREDENTIAL_ROTATED
    # an old credential cannot mint another one
    with pytest.raises(TransitionRefused) as refused:
        services.node_credential_rotate(credential=old, actor=SYSTEM, now=now)
    assert refused.value.code == "credential_already_rotated"


def test_credential_expiry_and_revocation(ready_node, operator, now):
    credential = ready_node.credential
    later = credential.expires_at
    assert services.credential_for_secret(ready_node.secret, now=later) == (
        None,
        "credential expired",
    )
    with pytest.raises(TransitionRefused):
        services.node_credential_rotate(credential=credential, actor=SYSTEM, now=later)
    count = services.node_credentials_revoke(node=ready_node.node, actor=Actor.for_user(operator))
    assert count == 1
    assert services.credential_for_secret(ready_node.secret) == (None, "credential revoked")
    assert last_event(ready_node.node).reason == Reason.CREDENTIAL_REVOKED


def test_operator_reissue_keeps_old_credential_for_the_overlap(ready_node, operator, now):
    new, secret = services.node_credential_reissue(
        node=ready_node.node, actor=Actor.for_user(operator), now=now
    )
    assert services.credential_for_secret(ready_node.secret, now=now)[0]
    assert (
        services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=10))[0]
        is None
    )
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=10))[0] == new


def test_retired_node_credential_is_refused(ready_node):
    services.node_retire(node=ready_node.node, actor=SYSTEM)
    assert services.credential_for_secret(ready_node.secret)[0] is None
