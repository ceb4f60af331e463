"""Fair share counts what a tenant holds through the lease API (leases without a job) exactly
as it counts its jobs' leases (scheduling/fairshare.py: `standings` and `charge` read every
lease of the tenant in the pool, job or not): a tenant that holds the pool through the lease
API ranks behind one that holds nothing, now and — through its decayed usage — after it let go."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_tenant, gpu_request, pinned_test_image
from jobs.services import job_submit
from leases.services import lease_release, lease_reserve
from pools.reasons import Reason
from scheduling import fairshare
from scheduling.models import TenantUsage
from scheduling.passes import scheduling_pass


def gpu_job(pool, tenant):
    return job_submit(
        tenant=tenant,
        pool=pool,
        name="one-gpu",
        image=pinned_test_image(),
        actor=SYSTEM,
        resources=gpu_request(count=1),
    )


@pytest.fixture
def pool(agent):
    return agent.node.pool  # one node, two GPUs


def test_a_tenant_holding_the_pool_through_the_lease_api_ranks_behind_one_holding_nothing(
    pool, tenant, other_tenant
):
    """Tenant A holds one of the two GPUs with a lease-API lease; A and B each queue a one-GPU
    job, A's first (it waited longer, the tie-break among equal shares). One GPU is free: the
    pass gives it to B."""
    held = lease_reserve(
        pool=pool, tenant=tenant, request=gpu_request(count=1), actor=SYSTEM, duration=3600
    )
    assert held.job_id is None
    first = gpu_job(pool, tenant)
    second = gpu_job(pool, other_tenant)

    result = scheduling_pass(pool_id=pool.pk)

    assert result.placed == [second.pk]
    assert result.pending[first.pk] == Reason.NO_CAPACITY.value
    standing = fairshare.standings(pool.pk, [tenant.pk, other_tenant.pk])
    assert standing[tenant.pk].held[2] == 1.0 and standing[other_tenant.pk].held[2] == 1.0


def test_lease_api_holding_time_is_charged_to_the_decayed_usage(pool, tenant, other_tenant):
    """A held one GPU for an hour through the lease API and let go an hour ago; then A and B
    each queue a one-GPU job, A's first, with one GPU free: A's decayed usage puts B first."""
    t0 = timezone.now() - timedelta(hours=2)
    held = lease_reserve(
        pool=pool, tenant=tenant, request=gpu_request(count=1), actor=SYSTEM, duration=7200, now=t0
    )
    fairshare.charge(pool.pk, t0)  # A's memory starts at its first charge while it holds
    t1 = t0 + timedelta(hours=1)
    fairshare.charge(pool.pk, t1)
    lease_release(lease=held, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=t1)
    usage = TenantUsage.objects.get(pool=pool, tenant=tenant)
    assert 0.5 * 3600 < usage.gpu_s <= 3600  # one GPU for an hour, decayed by the half-life
    # a third tenant takes one GPU, so one is left for A's job or B's
    lease_reserve(
        pool=pool,
        tenant=build_tenant("third"),
        request=gpu_request(count=1),
        actor=SYSTEM,
        duration=3600,
    )
    first = gpu_job(pool, tenant)
    second = gpu_job(pool, other_tenant)

    result = scheduling_pass(pool_id=pool.pk)

    assert result.placed == [second.pk]
    assert result.pending[first.pk] == Reason.NO_CAPACITY.value
