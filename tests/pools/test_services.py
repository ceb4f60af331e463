"""Pool services: a new pool's policy."""

from dataclasses import replace

import pytest

from leases import snapshot
from placement import DEFAULT_POLICY
from pools.models import SchedulingPolicyVersion


def test_a_new_pools_first_policy_version_is_the_default_and_places_with_it(pool):
    version = pool.scheduling_policy.current
    assert (version.number, version.weights, version.knobs) == (1, DEFAULT_POLICY.weights, {})
    mixing = pool.allow_tenant_mixing_on_shared_gpus
    assert snapshot.pool_policy(pool) == replace(DEFAULT_POLICY, allow_tenant_mixing=mixing)


def test_the_snapshot_refuses_a_stored_name_the_core_does_not_know(pool):
    # Publishing refuses it; a row written around the services must not be half-read either.
    SchedulingPolicyVersion.objects.create(
        policy=pool.scheduling_policy, number=2, weights={"binpack": 1.0}
    )
    with pytest.raises(ValueError, match="'binpack' is unknown"):
        snapshot.pool_policy(pool)
