"""The capacity guards, stated once (leases/services/capacity.py), hold alike rendered to SQL
(PostgreSQL's bulk statements) and to the ORM (the portable path SQLite takes): a write planned
on a snapshot that another write made stale is refused, on every kind of device."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, cpu_request, gpu_request
from leases import snapshot
from leases.selectors import ledger_problems
from leases.services import ledger
from nodes.models import GpuDevice
from placement import place


@pytest.fixture(params=[False, True], ids=["postgresql", "portable"])
def portable(request, settings):
    settings.LEASE_PORTABLE_PATHS = request.param
    return request.param


def planned(pool, tenant, request) -> ledger.Row:
    """A lease row placed on a snapshot taken now (the rows planned before any is written see
    the same free devices)."""
    view = snapshot.pool_snapshot(pool.pk, leases=False)
    req = snapshot.core_request(request, tenant.pk)
    placement = place(req, view.nodes, snapshot.pool_policy(pool))
    node_id = view.node_ids[placement.node]
    now = timezone.now()
    shared = ledger.Shared(pool=pool, actor=SYSTEM, now=now, expires_at=now + timedelta(hours=1))
    return ledger.lease_row(
        shared,
        tenant_id=tenant.pk,
        request=request,
        placement=placement,
        node_id=node_id,
        allocations=ledger.gpu_allocations(placement, view, node_id),
    )


@pytest.mark.parametrize(
    ("gpu", "request_"),
    [
        ({}, gpu_request(count=1)),  # a whole device
        ({"sharing_mode": "timeslice"}, gpu_request("timeslice", milli=600)),  # no room for two
        ({"mig_enabled": True}, gpu_request("mig", 1, mig_profile="7g.80gb")),  # one slice set
    ],
    ids=["whole", "share", "mig"],
)
def test_a_device_taken_since_the_snapshot_is_refused(lpool, ltenant, portable, gpu, request_):
    node = build_node(lpool, "g1", cpu=8000, memory=16384, gpus=[gpu])
    first, second = planned(lpool, ltenant, request_), planned(lpool, ltenant, request_)
    assert ledger.apply([first]).taken == [first]
    applied = ledger.apply([second])  # planned before the first was written: the same device
    assert applied.taken == [] and applied.conflicts == [(second, node.pk)]
    assert ledger_problems(lpool) == []


def test_a_share_of_another_tenant_is_refused_where_tenants_do_not_mix(
    lpool, ltenant, ltenant2, portable
):
    build_node(lpool, "g1", cpu=8000, memory=16384, gpus=[{"sharing_mode": "timeslice"}])
    mine = planned(lpool, ltenant, gpu_request("timeslice", milli=250))
    theirs = planned(lpool, ltenant2, gpu_request("timeslice", milli=250))
    assert ledger.apply([mine]).taken == [mine]
    assert ledger.apply([theirs]).taken == []
    again = planned(lpool, ltenant, gpu_request("timeslice", milli=250))
    assert ledger.apply([again]).taken == [again]  # the same tenant shares its device
    assert GpuDevice.objects.get(node__name="g1").milli_reserved == 500
    assert ledger_problems(lpool) == []


def test_a_group_that_loses_a_node_takes_nothing_and_the_rest_is_written(lpool, ltenant, portable):
    node = build_node(lpool, "n1", cpu=2000, memory=4096)
    build_node(lpool, "n2", cpu=2000, memory=4096)
    build_node(lpool, "n3", cpu=2000, memory=4096, gpus=[{}])
    pinned = [
        planned(lpool, ltenant, cpu_request(cpu=2000, memory=1024, node_pin=name))
        for name in ("n1", "n2")
    ]
    gpu = planned(lpool, ltenant, gpu_request(count=1, cpu=1000, memory=1024))
    for row in pinned:
        row.group = "gang"
    assert ledger.apply([planned(lpool, ltenant, cpu_request(cpu=1000, node_pin="n1"))]).taken
    applied = ledger.apply([*pinned, gpu])  # n1 is no longer free for the gang's first member
    assert applied.taken == [gpu]
    assert applied.conflicts == [(pinned[0], node.pk), (pinned[1], node.pk)]
    assert ledger_problems(lpool) == []
