"""Live lease events (pools/events.py): on commit, each transition goes to the lease's tenant,
to operators and to followers of the lease itself, at /ws/leases/."""

from pools.events import groups_of, publish_event

STREAM = "leases"


def publish_lease_event(lease, _event=None) -> None:
    """Wakes the sockets that may see `lease`'s events; they read the event itself (the
    transition's `_event`, committed) from the event table."""
    publish_event(groups_of(STREAM, lease))
