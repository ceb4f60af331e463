"""The beat tasks run their services with the current time (eager Celery in tests)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import gpu_inventory
from config.celery import app
from nodes import services, tasks
from nodes.choices import NodeState, Reachability
from nodes.models import Node

pytestmark = pytest.mark.django_db


def test_beat_schedule_names_registered_tasks():
    schedule = app.conf.beat_schedule
    names = {entry["task"] for key, entry in schedule.items() if key.startswith("nodes-")}
    assert names == {
        "nodes.heartbeat_sweep",
        "nodes.inventory_reconcile_sweep",
    }
    assert names <= set(app.tasks)


def test_heartbeat_sweep_task(ready_node):
    Node.objects.filter(pk=ready_node.node.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    assert tasks.heartbeat_sweep.delay().get() == [ready_node.node.pk]
    node = Node.objects.get(pk=ready_node.node.pk)
    assert (node.state, node.reachability) == (NodeState.READY, Reachability.UNREACHABLE)


def test_inventory_reconcile_task(ready_node):
    inv = gpu_inventory(gpus=0)
    inv["gpus"] = list(ready_node.node.inventory["gpus"])
    inv["memory_mib"] = 256000
    services.node_inventory_report(node=ready_node.node, inventory=inv)
    assert tasks.inventory_reconcile_sweep.delay().get() == {ready_node.node.pk: 1}
    assert Node.objects.get(pk=ready_node.node.pk).state == NodeState.QUARANTINED
