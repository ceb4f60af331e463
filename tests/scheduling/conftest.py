"""The scheduling pass tests build on the lease tests' pools and nodes (tests/leases/conftest.py)
and submit jobs through the service."""

from jobs.services import job_submit
from tests.leases.conftest import SYSTEM, cpu_request, lpool, ltenant  # noqa: F401 (fixtures)

IMAGE = "127.0.0.1:5000/computepool/busybox@sha256:" + "c" * 64


def submit(pool, tenant, name, cpu=1000, priority=None):
    """A queued CPU job, through the service (the scheduling pass places it)."""
    return job_submit(
        tenant=tenant,
        pool=pool,
        name=name,
        image=IMAGE,
        actor=SYSTEM,
        resources=cpu_request(cpu=cpu, memory=512),
        priority_class=priority,
    )
