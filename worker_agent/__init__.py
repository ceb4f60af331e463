"""The worker agent: the data plane that runs on each node.

A standalone distribution (`pyproject.toml` here; `pip install ./worker_agent`) — it never
imports Django or the control plane's apps and talks to the control plane only over its HTTP API
with the node's own credential. Today it holds the node-side GPU inventory reader
(`inventory.py`, NVML) and the inventory format both sides check against (`schema.py`,
`schemas/inventory-v1.json`); enrollment, heartbeats and running containers through the Docker
engine build on it (roadmap item 6).
"""
