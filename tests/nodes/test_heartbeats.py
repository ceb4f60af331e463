"""Heartbeats, unreachable nodes and their return (nodes/services/heartbeats.py); the ledger's
side arrives through nodes.signals (leases/receivers.py)."""

from datetime import timedelta

import pytest

from leases.choices import LeaseState
from nodes import services
from nodes.choices import NodeState, Reachability
from nodes.errors import NodeScopeRefused
from pools.actors import Actor
from pools.reasons import Reason

from .conftest import last_event, reasons

S = NodeState


def test_missed_heartbeats_mark_unreachable_and_leases_uncertain(ready_node, make_job, now):
    node = ready_node.node
    _job, lease = make_job(node)
    interval = node.pool.heartbeat_interval_s
    assert (
        services.node_heartbeat_sweep(now=node.last_heartbeat_at + timedelta(seconds=interval))
        == []
    )
    later = node.last_heartbeat_at + timedelta(seconds=3 * interval + 1)
    assert services.node_heartbeat_sweep(now=later) == [node.pk]
    node.refresh_from_db()
    assert (node.state, node.reachability) == (S.READY, Reachability.UNREACHABLE)
    event = last_event(node)
    assert (event.reason, event.from_state, event.to_state) == (
        Reason.NODE_UNREACHABLE,
        S.READY,
        S.READY,
    )
    assert event.data["leases"] == [lease.pk]
    lease.refresh_from_db()
    assert lease.state == LeaseState.UNCERTAIN
    assert lease.events.last().reason == Reason.NODE_SILENT
    # a second sweep finds nothing to do
    assert services.node_heartbeat_sweep(now=later + timedelta(seconds=1)) == []


def test_return_reconciles_reported_and_vanished_workloads(ready_node, make_job, now):
    node = ready_node.node
    _, kept = make_job(node)
    _, gone = make_job(node)
    later = node.last_heartbeat_at + timedelta(seconds=100)
    services.node_heartbeat_sweep(now=later)
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 2000
    node = services.node_heartbeat(
        node=node,
        actor=Actor.for_node(node),
        workloads=[{"lease": kept.pk, "job": kept.job_id}],
        now=later + timedelta(seconds=5),
    )
    assert node.reachability == Reachability.REACHABLE
    assert Reason.NODE_RETURNED in reasons(node)
    kept.refresh_from_db()
    gone.refresh_from_db()
    assert kept.state == LeaseState.COMMITTED
    assert kept.events.last().reason == Reason.RECONCILED_RUNNING
    assert gone.state == LeaseState.RELEASED
    assert gone.events.last().reason == Reason.RECONCILED_GONE
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 1000  # the vanished workload's capacity came back


def test_heartbeat_refuses_leases_and_jobs_of_other_nodes(
    ready_node, enroll, private_pool, make_job
):
    other = enroll(private_pool).node
    job, lease = make_job(other)
    node = ready_node.node
    with pytest.raises(NodeScopeRefused):
        services.node_heartbeat(
            node=node, actor=Actor.for_node(node), workloads=[{"lease": lease.pk}]
        )
    with pytest.raises(NodeScopeRefused):
        services.node_heartbeat(node=node, actor=Actor.for_node(node), workloads=[{"job": job.pk}])


def test_heartbeat_updates_usage_and_agent_version(ready_node, now):
    node = services.node_heartbeat(
        node=ready_node.node,
        actor=Actor.for_node(ready_node.node),
        usage={"cpu_millicores": 1200},
        agent_version="0.2.0",
        now=now,
    )
    assert node.usage == {"cpu_millicores": 1200}
    assert (node.agent_version, node.last_heartbeat_at) == ("0.2.0", now)


def test_image_pull_times_are_kept_per_digest_and_bounded(ready_node, settings):
    settings.NODE_IMAGE_PULL_TIMES_MAX = 3
    node = ready_node.node
    digests = [f"sha256:{n:064x}" for n in range(5)]
    services.node_heartbeat(node=node, actor=Actor.for_node(node), images=digests[3:])
    for n, digest in enumerate(digests):
        services.node_image_pull_record(node=node, image=f"r/x@{digest}", seconds=n + 0.5)
    services.node_image_pull_record(node=node, image=digests[4], seconds=9.0)  # newest wins
    node.refresh_from_db()
    # past the bound, digests no longer in the node's cache went first
    assert node.image_pull_seconds == {digests[2]: 2.5, digests[3]: 3.5, digests[4]: 9.0}
    assert services.node_image_pull_record(node=node, image="r/x:latest", seconds=1) == {}
