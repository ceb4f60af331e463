"""The worker agent: the data plane that runs on each node.

A standalone distribution (`pyproject.toml` here; `pip install ./worker_agent`) — it never
imports Django or the control plane's apps and talks to the control plane only over its HTTP API
with the node's own credential (docs/data-plane.md).
`python -m worker_agent --api URL --state-dir DIR --enroll-token-file FILE` enrolls, reports
inventory (`host.py`, GPUs through NVML in `inventory.py`, checked against `schema.py`),
heartbeats, and runs its assignments (`agent.py`, `runner.py`) in containers through the Docker
engine (`runtime/docker.py`) or, in pools that allow it, as local processes that do not isolate
(`runtime/process.py`).
"""

__version__ = "0.1.0"
