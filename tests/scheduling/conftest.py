"""Drain enforcement acts on an enrolled node's jobs: the node tests' fixtures (an agent's ready
node, jobs with leases on it) serve here too. And one way to make a pass's plan conflict."""

from datetime import timedelta

from config.builders import cpu_request
from leases.services import lease_reserve
from pools.actors import Actor
from scheduling.pass_steps import apply
from tests.nodes.conftest import make_job, now, person, ready_node, tenant  # noqa: F401 (fixtures)


def another_writer_takes_before_apply(monkeypatch, owner, node: str, cpu: int) -> None:
    """The lease API (another writer, for `owner`) reserves `cpu` millicores on `node` between
    the pass's snapshot and its apply: what the pass planned there becomes a plan_conflict."""
    real_apply = apply.apply_plan

    def apply_after_the_other_writer(pool, plan, *args):
        lease_reserve(
            pool=pool,
            tenant=owner,
            request=cpu_request(cpu=cpu, memory=1024, node_pin=node),
            actor=Actor.system("elsewhere"),
            duration=timedelta(minutes=5),
        )
        return real_apply(pool, plan, *args)

    monkeypatch.setattr(apply, "apply_plan", apply_after_the_other_writer)
