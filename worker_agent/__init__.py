"""The worker agent: the data plane that runs on each node.

A standalone package — it never imports Django or the control plane's apps and talks to the
control plane only over its HTTP API with the node's own credential. Today it holds the node-side
GPU inventory reader (`inventory.py`, NVML); enrollment, heartbeats and running containers
through the Docker engine build on it (roadmap item 6).
"""
