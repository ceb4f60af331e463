"""Enrollment tokens and enrolling a node (nodes/services/enrollment.py)."""

from datetime import timedelta

import pytest

from config.builders import gpu_inventory
from nodes import services
from nodes.choices import NodeState
from nodes.errors import EnrollmentRefused
from nodes.models import Node, NodeCredential, NodeEvent
from pools.actors import Actor
from pools.models import token_digest
from pools.reasons import Reason
from worker_agent.identity import NodeKey

from .conftest import last_event, reasons

S = NodeState


def test_enroll_private_node_registers_with_inventory_and_credential(enroll, private_pool):
    enrolled = enroll(private_pool)
    node = enrolled.node
    assert node.state == S.REGISTERED
    assert reasons(node) == [Reason.ENROLLED]
    assert node.gpus.count() == 2
    gpu = node.gpus.get(index=0)
    assert (gpu.model, gpu.memory_mib, gpu.cuda_version) == ("NVIDIA H100 80GB HBM3", 81559, "12.4")
    assert node.inventory["cpu_millicores"] == 64000
    assert node.cpu_millicores_allocatable < node.cpu_millicores_raw
    assert node.identity_fingerprint and "ssh" not in node.identity_fingerprint
    assert enrolled.secret.startswith("cpn_")
    credential = NodeCredential.objects.get(node=node)
    assert credential.digest == token_digest(enrolled.secret)
    assert enrolled.secret not in str(NodeCredential.objects.values_list())
    assert enrolled.probe is None
    assert node.enrollment_token.uses == 1


def test_enroll_refuses_unknown_expired_revoked_and_used_up_tokens(private_pool, operator, now):
    actor = Actor.for_user(operator)

    def attempt(secret, name, at=None):
        return services.node_enroll(
            secret=secret,
            name=name,
            inventory=gpu_inventory(gpus=0),
            public_key=NodeKey.generate().public_key,
            now=at or now,
        )

    with pytest.raises(EnrollmentRefused, match="Unknown"):
        attempt("cpe_nope", "a")

    token, secret = services.enrollment_token_issue(
        pool=private_pool, actor=actor, ttl=timedelta(hours=1), now=now
    )
    with pytest.raises(EnrollmentRefused, match="expired"):
        attempt(secret, "late", at=now + timedelta(hours=1, seconds=1))

    token, secret = services.enrollment_token_issue(pool=private_pool, actor=actor, max_uses=2)
    attempt(secret, "one")
    attempt(secret, "two")
    with pytest.raises(EnrollmentRefused, match="used up"):
        attempt(secret, "three")
    token.refresh_from_db()
    assert token.uses == 2

    token, secret = services.enrollment_token_issue(pool=private_pool, actor=actor, max_uses=5)
    services.enrollment_token_revoke(token=token)
    with pytest.raises(EnrollmentRefused, match="revoked"):
        attempt(secret, "four")
    assert set(Node.objects.values_list("name", flat=True)) == {"one", "two"}


def test_private_node_first_authenticated_heartbeat_verifies_and_readies(enroll, private_pool):
    enrolled = enroll(private_pool)
    node = services.node_heartbeat(node=enrolled.node, actor=Actor.for_node(enrolled.node))
    assert node.state == S.READY
    events = list(NodeEvent.objects.filter(node=node).values_list("from_state", "to_state"))
    assert events == [("", S.REGISTERED), (S.REGISTERED, S.VERIFIED), (S.VERIFIED, S.READY)]
    assert reasons(node)[1:] == [Reason.AGENT_AUTHENTICATED, Reason.AGENT_AUTHENTICATED]
    assert last_event(node).actor_label == f"node:{node.name}"
    # further heartbeats change nothing
    services.node_heartbeat(node=node, actor=Actor.for_node(node))
    assert NodeEvent.objects.filter(node=node).count() == 3
