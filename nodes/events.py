"""Live node events (pools/events.py): on commit, each transition goes to operators and to
followers of the node itself, at /ws/nodes/ (operators only, like the node API)."""

from pools.events import groups_of, publish_event

STREAM = "nodes"


def publish_node_event(node, _event=None) -> None:
    """Wakes the sockets that may see `node`'s events; they read the event itself (the
    transition's `_event`, committed) from the event table."""
    publish_event(groups_of(STREAM, node))
