"""Inventory drift and its reconciliation (nodes/inventory.py, nodes/services/inventory.py)."""

from config.builders import SYSTEM, gpu_inventory
from nodes import services
from nodes.choices import GpuHealth, NodeState
from nodes.models import Node, NodeEvent
from pools.reasons import Reason

from .conftest import last_event, measured

S = NodeState


def report(node, **changes):
    inv = gpu_inventory(
        gpus=0, cpu=node.inventory["cpu_millicores"], memory=node.inventory["memory_mib"]
    )
    inv["gpus"] = [dict(g) for g in node.inventory["gpus"]]
    inv.update(changes)
    return inv


def test_small_drift_adjusts_capacity_with_an_event(ready_node, now):
    node = ready_node.node
    services.node_inventory_report(node=node, inventory=report(node, memory_mib=500000), now=now)
    diffs = services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now)
    assert diffs == [{"field": "memory_mib", "from": 512000, "to": 500000, "percent": -2.3}]
    node.refresh_from_db()
    assert node.state == S.READY
    assert node.memory_mib_raw == 500000
    assert node.memory_mib_allocatable == int((500000 - 1024) * 0.95)
    event = last_event(node)
    assert event.reason == Reason.INVENTORY_DRIFT and "memory_mib: 512000 → 500000" in event.message
    # reconciling the same report again finds nothing
    assert services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now) == []


def test_gpu_gone_is_large_drift_and_quarantines(ready_node, now):
    node = ready_node.node
    gone = node.gpus.get(index=1)
    inv = report(node)
    inv["gpus"] = inv["gpus"][:1]
    services.node_inventory_report(node=node, inventory=inv, now=now)
    results = services.inventory_reconcile_sweep(now=now)
    assert list(results) == [node.pk]
    node.refresh_from_db()
    gone.refresh_from_db()
    assert node.state == S.QUARANTINED
    assert (gone.healthy, gone.health) == (False, GpuHealth.MISSING)
    event = last_event(node)
    assert event.reason == Reason.INVENTORY_DRIFT and event.to_state == S.QUARANTINED
    assert "gone" in event.message and event.data["large"] is True
    assert services.inventory_reconcile_sweep(now=now) == {}


def test_any_drift_in_a_marketplace_pool_quarantines(enroll, market_pool):
    enrolled = enroll(market_pool)
    services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(enrolled.node)
    )
    node = Node.objects.get(pk=enrolled.node.pk)
    inv = report(node)
    inv["gpus"][0]["driver_version"] = "535.0"
    services.node_inventory_report(node=node, inventory=inv)
    services.node_inventory_reconcile(node=node, actor=SYSTEM)
    node.refresh_from_db()
    assert node.state == S.QUARANTINED
    assert "untrusted" in last_event(node).message


def test_drift_under_a_running_job_ends_it_then_allocatable_comes_down(ready_node, make_job, now):
    """The job that lost its capacity ends (`capacity_vanished`: its retry policy does not
    retry it, so it fails; tests/observability/test_trace_api.py has the rest), its lease
    with it; then the ledger holds what the node reported, never below what leases hold."""
    node = ready_node.node
    job, _ = make_job(node, cpu=20000)
    services.node_inventory_report(node=node, inventory=report(node, cpu_millicores=8000), now=now)
    services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now)
    node.refresh_from_db()
    job.refresh_from_db()
    assert job.state == "failed" and job.events.latest("id").reason == Reason.CAPACITY_VANISHED
    assert node.cpu_millicores_reserved == 0
    assert 0 < node.cpu_millicores_allocatable < 8000
    assert node.state == S.QUARANTINED  # −87 % is large
    drift = NodeEvent.objects.filter(node=node, reason=Reason.INVENTORY_DRIFT).first()
    assert drift.data["capped_by_reserved"] == ["cpu_millicores"]


def test_a_compute_capability_first_reported_is_stored_without_drift_and_a_change_is_drift(
    ready_node, now
):
    node = ready_node.node
    for gpu in node.inventory["gpus"]:  # registered by an agent that did not read capabilities
        gpu.pop("compute_capability", None)
    node.save(update_fields=["inventory"])
    node.gpus.update(compute_capability="")
    services.node_inventory_report(node=node, inventory=report(node), now=now)
    reported = report(node)
    for gpu in reported["gpus"]:
        gpu["compute_capability"] = "9.0"
    services.node_inventory_report(node=node, inventory=reported, now=now)
    assert services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now) == []
    assert set(node.gpus.values_list("compute_capability", flat=True)) == {"9.0"}
    node.refresh_from_db()
    assert node.state == S.READY and node.inventory["gpus"][0]["compute_capability"] == "9.0"
    reported["gpus"][0]["compute_capability"] = "8.0"  # a different device behind the UUID
    services.node_inventory_report(node=node, inventory=reported, now=now)
    diffs = services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now)
    assert [d["field"] for d in diffs] == ["gpu.compute_capability"]
    assert node.gpus.get(index=0).compute_capability == "8.0"
