"""Drain enforcement acts on an enrolled node's jobs: the node tests' fixtures (an agent's ready
node, jobs with leases on it) serve here too."""

from tests.nodes.conftest import make_job, now, person, ready_node, tenant  # noqa: F401 (fixtures)
