"""The agent's own metrics (docs/observability.md, "The agent's metrics"), served on a local
port when the agent is started with --metrics-port (off by default): how long since the control
plane last took a heartbeat, how long an assignment waited between its lease and this agent
picking it up, image pull and container start times, and how many workloads it runs."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

PREFIX = "computepool_agent_"
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class AgentMetrics:
    """A registry of its own (nothing of the process's default one): what /metrics shows."""

    def __init__(self, workloads: Callable[[], int]):
        self.registry = CollectorRegistry()
        self.last_heartbeat: float | None = None
        self.server = None
        heartbeat_age = Gauge(
            PREFIX + "heartbeat_age_seconds",
            "Seconds since the control plane last accepted a heartbeat (-1: none yet).",
            registry=self.registry,
        )
        heartbeat_age.set_function(
            lambda: -1.0 if self.last_heartbeat is None else time.time() - self.last_heartbeat
        )
        workloads_gauge = Gauge(
            PREFIX + "containers",
            "Workloads this agent runs or watches (one per assigned attempt).",
            registry=self.registry,
        )
        workloads_gauge.set_function(workloads)
        self.assignment_lag = Histogram(
            PREFIX + "assignment_lag_seconds",
            "Seconds from an attempt's lease (the control plane's clock) to this agent taking "
            "it up.",
            buckets=SECONDS,
            registry=self.registry,
        )
        self.image_pull = Histogram(
            PREFIX + "image_pull_seconds",
            "Seconds to check or pull an attempt's image.",
            buckets=SECONDS,
            registry=self.registry,
        )
        self.container_start = Histogram(
            PREFIX + "container_start_seconds",
            "Seconds to create and start an attempt's container.",
            buckets=SECONDS,
            registry=self.registry,
        )

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve /metrics on address:port (0: a free port); returns the port."""
        self.server, _ = start_http_server(port, addr=address, registry=self.registry)
        return self.server.server_port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def heartbeat_taken(self) -> None:
        self.last_heartbeat = time.time()

    def taken_up(self, leased_at: float | None) -> None:
        if leased_at is not None:
            self.assignment_lag.observe(max(0.0, time.time() - leased_at))
