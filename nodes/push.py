"""Assignments pushed to agents (docs/data-plane.md "Assignments"): when what a node's agent
should run may have changed (a job placed on it, a job cancelled or its lease ending, a
checkpoint requested), the node's group on the channel layer gets a nudge once the change
commits; the agent's long poll (`GET /api/v1/agent/assignments/wait`, jobs/api/wait.py) wakes
and the agent reads its assignments as it does at every poll. A nudge carries nothing: the
assignments, their fencing tokens and secrets are only ever read from the normal endpoint, and
a nudge that is lost (no agent waiting, a broken channel layer) costs at most one poll.

Publishing never holds up the writer: `push_assignments` registers, per call, an on-commit
callback that only queues node ids; one daemon thread per process, with one event loop of its
own (so the channel layer's connections are reused), sends them, one `group_send` per node for
everything queued meanwhile (a pass placing thousands of jobs sends one nudge per node). A
failure there is logged; the committed change stands.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Iterable

from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "assignments.changed"
WAIT_MIN_S, WAIT_MAX_S, WAIT_DEFAULT_S = 1.0, 30.0, 25.0


def node_group(node_id: int) -> str:
    """The channel-layer group of one node's waiting agent requests."""
    return f"agent.node-{int(node_id)}"


def push_assignments(node_ids: Iterable[int | None], *, actor=None) -> None:
    """Nudge these nodes' agents once the current transaction commits (at once outside one).
    A change the node's own agent made (`actor` is that node) is not pushed back to it. Never
    raises: the change is the database's, the nudge only a hint."""
    try:
        own = getattr(getattr(actor, "node", None), "pk", None) if actor is not None else None
        ids = frozenset(int(i) for i in node_ids if i is not None and i != own)
        if ids:
            transaction.on_commit(lambda: _queue(ids))
    except Exception:
        logger.warning("could not queue an assignments push to %s", node_ids, exc_info=True)


def _queue(ids: frozenset[int]) -> None:
    """On commit: a callback that raised would reach the writer after its commit."""
    try:
        _sender.put(ids)
    except Exception:
        logger.warning("could not queue an assignments push to %s", sorted(ids), exc_info=True)


def flush(timeout: float = 5.0) -> bool:
    """Wait until every nudge queued so far in this process was sent (or failed); for tests."""
    return _sender.idle(timeout)


class _Sender:
    """One daemon thread per process (started on first use, again in a forked child) that
    sends queued nudges from an event loop of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._pending = 0

    def put(self, ids: frozenset[int]) -> None:
        with self._lock:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid, self._pending = os.getpid(), 0
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="assignments-push", daemon=True
                )
                self._thread.start()
            self._pending += 1
            self._queue.put(ids)

    def idle(self, timeout: float) -> bool:
        with self._lock:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def _run(self, work: queue.SimpleQueue) -> None:
        loop = asyncio.new_event_loop()
        while True:
            batches = [work.get()]
            while True:  # everything queued meanwhile: one nudge per node
                try:
                    batches.append(work.get_nowait())
                except queue.Empty:
                    break
            ids = sorted(set().union(*batches))
            try:
                loop.run_until_complete(_send(ids))
            except Exception:
                logger.warning("could not push assignments to nodes %s", ids, exc_info=True)
            with self._lock:
                if work is self._queue:
                    self._pending = max(0, self._pending - len(batches))
                    self._done.notify_all()


async def _send(node_ids: list[int]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for node_id in node_ids:
        await layer.group_send(node_group(node_id), {"type": MESSAGE_TYPE})


_sender = _Sender()


async def wait_for_push(node_id: int, timeout: float) -> bool:
    """Subscribe to the node's group and wait for a nudge: True when one came within `timeout`
    seconds, False when none did. Raises when the channel layer cannot be reached (the caller
    answers 503; the agent falls back to its polls). Unsubscribes however it ends, a client
    that went away included (Django cancels the view)."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured")
    channel = await layer.new_channel("agent-wait.")
    group = node_group(node_id)
    await layer.group_add(group, channel)
    try:
        await asyncio.wait_for(layer.receive(channel), timeout)
        return True
    except TimeoutError:
        return False
    finally:
        try:
            await asyncio.shield(layer.group_discard(group, channel))
        except Exception:  # the group's entry expires by itself (channels_redis group_expiry)
            logger.debug("could not leave %s", group, exc_info=True)
