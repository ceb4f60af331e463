"""Live lease events (pools/events.py): on commit, each transition goes to the lease's tenant,
to operators and to followers of the lease itself, at /ws/leases/."""

from pools.events import event_fields, groups_of, publish_event

STREAM = "leases"


def publish_lease_event(lease, event) -> None:
    publish_event(
        groups_of(STREAM, lease),
        {
            "lease": lease.pk,
            "tenant": lease.tenant_id,
            "pool": lease.pool_id,
            "node": lease.node_id,
            "job": lease.job_id,
            "state": lease.state,
            **event_fields(event),
        },
    )
