"""Thin Celery tasks: each calls one service with `now`; the services are guarded, so running
them on several workers at once is safe."""

from celery import shared_task
from django.utils import timezone

from . import services


@shared_task(name="nodes.heartbeat_sweep")
def heartbeat_sweep() -> list[int]:
    return services.node_heartbeat_sweep(now=timezone.now())


@shared_task(name="nodes.inventory_reconcile_sweep")
def inventory_reconcile_sweep() -> dict[int, int]:
    results = services.inventory_reconcile_sweep(now=timezone.now())
    return {node_id: len(diffs) for node_id, diffs in results.items()}
