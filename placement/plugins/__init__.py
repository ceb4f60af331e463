"""The core's filters and scorers, one module per concern; importing this package registers
them all (``placement.registry``).

To add one: a module here that decorates its function with ``register_filter`` (name, reason
codes, static or not, when it applies) or ``register_scorer`` (name, when it applies), its
import below, and a test in ``tests/placement/plugins/``. A new filter runs once a policy
lists it (``types.DEFAULT_FILTERS`` for the default chain); a new scorer once a policy weighs it.
"""

from . import affinity, capacity, fgd, images, node, packing, paper, platform, price, topology

__all__ = [
    "affinity",
    "capacity",
    "fgd",
    "images",
    "node",
    "packing",
    "paper",
    "platform",
    "price",
    "topology",
]
