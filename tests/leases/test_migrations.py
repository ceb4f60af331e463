"""Leases moved from scheduling/ to their own app by state-only migrations: a database that
holds leases, lease events and reservations from before the move keeps them — same ids, same
fields, same tables — and the constraints still hold."""

from datetime import timedelta

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from config.builders import build_node, build_pool, build_tenant
from leases.models import Lease, LeaseEvent

BEFORE_THE_MOVE = [("leases", None)]  # unapplies leases 0001 and scheduling 0006


def migrate(targets=None):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets or executor.loader.graph.leaf_nodes())
    executor.loader.build_graph()
    return executor


@pytest.mark.django_db(transaction=True)
def test_leases_events_and_reservations_survive_the_move():
    pool = build_pool("moved", exact_capacity=True)
    tenant = build_tenant("moved", name="Moved")
    node = build_node(pool, "m1", cpu=4000, memory=8192)
    content_type = ContentType.objects.get_for_model(Lease)
    now = timezone.now()
    try:
        executor = migrate(BEFORE_THE_MOVE)
        old = executor.loader.project_state(list(executor.loader.applied_migrations)).apps
        old_lease = old.get_model("scheduling", "Lease")
        old_event = old.get_model("scheduling", "LeaseEvent")
        assert old_lease._meta.db_table == Lease._meta.db_table == "scheduling_lease"
        assert ContentType.objects.get(app_label="scheduling", model="lease").pk == content_type.pk
        common = dict(pool_id=pool.pk, tenant_id=tenant.pk, node_id=node.pk, memory_mib=1024)
        running = old_lease.objects.create(
            **common,
            state="committed",
            cpu_millicores=1000,
            expires_at=now + timedelta(minutes=5),
            committed_at=now,
            idempotency_key="client-1",
            idempotency_digest="d" * 64,
            fencing_token=42,
            request={"cpu_millicores_min": 1000},
            placement={"node": "m1", "score": 0.5},
        )
        reservation = old_lease.objects.create(
            **common,
            cpu_millicores=2000,
            expires_at=now + timedelta(hours=2, minutes=5),
            window_start=now + timedelta(hours=2),
            window_end=now + timedelta(hours=3),
            tolerance_s=300,
        )
        backfill = old_lease.objects.create(
            **common,
            cpu_millicores=500,
            expires_at=now + timedelta(hours=1),
            backfill_of=reservation,
        )
        event = old_event.objects.create(
            lease=running,
            actor_kind="system",
            actor_label="system:before-the-move",
            from_state="reserved",
            to_state="committed",
            reason="committed",
            at=now,
        )
    finally:
        migrate()

    # the content type (and so the permissions granted on it) went back and forth with the model
    assert ContentType.objects.get(app_label="leases", model="lease").pk == content_type.pk
    moved = Lease.objects.in_bulk([running.pk, reservation.pk, backfill.pk])
    assert moved[running.pk].state == "committed"
    assert moved[running.pk].fencing_token == 42
    assert moved[running.pk].idempotency_key == "client-1"
    assert moved[running.pk].placement == {"node": "m1", "score": 0.5}
    assert moved[reservation.pk].is_reservation
    assert moved[reservation.pk].window_end == reservation.window_end
    assert moved[backfill.pk].backfill_of_id == reservation.pk
    assert list(moved[reservation.pk].backfills.all()) == [moved[backfill.pk]]
    assert list(LeaseEvent.objects.filter(lease_id=running.pk).values_list("pk", "reason")) == [
        (event.pk, "committed")
    ]
    # the constraints came along: one idempotency key per tenant
    with pytest.raises(IntegrityError), transaction.atomic():
        Lease.objects.create(
            pool=pool,
            tenant=tenant,
            node=node,
            cpu_millicores=1,
            memory_mib=1,
            expires_at=now,
            idempotency_key="client-1",
        )
    new = Lease.objects.create(
        pool=pool, tenant=tenant, node=node, cpu_millicores=1, memory_mib=1, expires_at=now
    )
    assert new.pk > backfill.pk  # the id sequence is the table's own
