"""Drain enforcement acts on an enrolled node's jobs: the node tests' fixtures (an agent's ready
node, jobs with leases on it) serve here too. And one way to make a pass's plan conflict."""

from contextlib import contextmanager
from datetime import timedelta

from config.builders import cpu_request
from leases.services import lease_reserve, ledger
from pools.actors import Actor
from tests.nodes.conftest import make_job, now, person, ready_node, tenant  # noqa: F401 (fixtures)


@contextmanager
def another_writer_takes_before_apply(owner, node: str, cpu: int):
    """Inside it, the lease API (another writer, for `owner`) reserves `cpu` millicores on
    `node` in the first ledger write, once its quotas are checked and before it takes any
    capacity (the ledger's race hook): what the pass planned there becomes a plan_conflict."""
    done = []

    def reserve_first(rows):
        if not done:
            done.append(lease_reserve(
                pool=rows[0].shared.pool,
                tenant=owner,
                request=cpu_request(cpu=cpu, memory=1024, node_pin=node),
                actor=Actor.system("elsewhere"),
                duration=timedelta(minutes=5),
            ))  # fmt: skip

    with ledger.race_hook(ledger.BEFORE_WRITES, reserve_first):
        yield
    assert done, "no ledger write came"
