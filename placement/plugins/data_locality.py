"""Data locality: prefer the node where the request's data (its image, its inputs) arrives
soonest, which is the node that already holds most of it, unless it is slow to fetch the rest
(docs/storage.md "Data locality").

The rule: for each node, the bytes of the request's data its caches already hold do not move
(``avoided``); the rest (``moved``) must, images at the node's measured pull throughput, inputs
at its measured download throughput (``DEFAULT_BYTES_PER_S`` where it measured none). The score
is ``1 / (1 + arrival_s / ARRIVAL_SCALE_S)``: 1 when nothing has to move, ½ when the rest takes
a minute to arrive. So a node holding everything wins over an equal one holding nothing; and a
node holding most of a huge dataset but fetching the rest slowly loses to a fast node whose whole
transfer is shorter: what is scored is when the data is there, the bytes avoided are only how.

A size comes from the node's own report where it holds the object, else from any other node's
report of it (``ScoreContext.data_sizes``); an object no node reports counts 0 bytes (unknown)."""

from __future__ import annotations

from ..context import Fit, ScoreContext
from ..registry import register_scorer
from ..types import NodeView, Request

# A node that measured no pull or download yet is assumed this fast (100 MB/s).
DEFAULT_BYTES_PER_S = 100e6
# The arrival time at which the score halves.
ARRIVAL_SCALE_S = 60.0


def data_keys(req: Request) -> tuple[str, ...]:
    """What the request needs on its node: its image digest, then its inputs' cache keys."""
    return ((req.image,) if req.image else ()) + tuple(req.inputs)


def estimate(req: Request, node: NodeView, sizes) -> tuple[int, int, float]:
    """(bytes avoided, bytes to move, seconds until they arrive) of the request on the node."""
    held = dict(node.cached_data) if node.cached_data else {}
    avoided = moved = 0
    seconds = 0.0
    for key in data_keys(req):
        if key in held:
            avoided += held[key]
            continue
        size = sizes.get(key, 0)
        moved += size
        image = key.startswith("sha256:")
        rate = node.pull_bytes_per_s if image else node.download_bytes_per_s
        seconds += size / (rate if rate > 0 else DEFAULT_BYTES_PER_S)
    return avoided, moved, seconds


def _applies(req: Request, ctx: ScoreContext) -> bool:
    # a request none of whose data any node reports scores every node alike: skipped
    return bool(ctx.data_sizes) and any(key in ctx.data_sizes for key in data_keys(req))


@register_scorer(
    "data_locality",
    reads=("cached_data", "pull_bytes_per_s", "download_bytes_per_s"),
    applies=_applies,
)
def data_locality(req: Request, node: NodeView, fit: Fit, ctx: ScoreContext) -> float:
    _, _, seconds = estimate(req, node, ctx.data_sizes)
    return 1.0 / (1.0 + seconds / ARRIVAL_SCALE_S)
