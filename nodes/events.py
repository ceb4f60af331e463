"""Live node events (pools/events.py): on commit, each transition goes to operators and to
followers of the node itself, at /ws/nodes/ (operators only, like the node API)."""

from pools.events import event_fields, groups_of, publish_event

STREAM = "nodes"


def publish_node_event(node, event) -> None:
    publish_event(
        groups_of(STREAM, node),
        {
            "node": node.pk,
            "name": node.name,
            "pool": node.pool_id,
            "state": node.state,
            **event_fields(event),
        },
    )
