"""The core's filters and scorers, one module per concern; importing this package registers
them all (``placement.registry``).

To add one: a module here that decorates its function with ``register_filter`` (name, reason
codes, the node fields it reads, static or not, the reasons work never lifts, when it applies),
``register_scorer`` (name, the node fields it reads, when it applies) or ``register_gpu_choice``,
its import below, and a test in ``tests/placement/plugins/``. A new filter runs once a policy
lists it (``types.DEFAULT_FILTERS`` for the default chain); a new scorer once a policy weighs it.
"""

from . import (
    affinity,
    capacity,
    data_locality,
    fgd,
    gpu_choice,
    images,
    node,
    packing,
    paper,
    platform,
    price,
    topology,
)

__all__ = [
    "affinity",
    "capacity",
    "data_locality",
    "fgd",
    "gpu_choice",
    "images",
    "node",
    "packing",
    "paper",
    "platform",
    "price",
    "topology",
]
