"""Real races on PostgreSQL: threads, each with its own connection, fight for the last units.

Afterwards no node holds more than allocatable in any dimension (CPU, memory, scratch, each GPU,
each MIG slot), every loser got a reason, and the ledger equals the sum of the live leases.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, build_tenant, cpu_request, gpu_request
from leases import selectors, services
from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent
from leases.selectors import ledger_problems
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

pytestmark = pytest.mark.django_db(transaction=True)


def run_threads(count, target):
    barrier = threading.Barrier(count)
    errors = []

    def wrapped(i):
        try:
            barrier.wait()
            target(i)
        except Exception as exc:  # surfaced below: a thread must never fail silently
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []


def test_many_clients_race_for_the_last_units(db):

    pool = build_pool("race", exact_capacity=True)
    tenants = [build_tenant(f"t{i}", name=f"T{i}") for i in range(2)]
    build_node(pool, "c1", cpu=4000, memory=8192, scratch=4000)
    build_node(pool, "c2", cpu=3000, memory=4096, scratch=3000)
    build_node(
        pool,
        "g1",
        cpu=8000,
        memory=16384,
        gpus=[{"sharing_mode": "timeslice"}, {"sharing_mode": "timeslice"}],
    )
    build_node(pool, "m1", cpu=8000, memory=16384, gpus=[{"mig_enabled": True}])
    shapes = [
        cpu_request(1000, 1024, 1000),
        cpu_request(1500, 2048),
        gpu_request("exclusive", 1, cpu=500, memory=512),
        gpu_request("timeslice", 1, 300, cpu=250, memory=256),
        gpu_request("mig", 1, mig_profile="2g.20gb", cpu=250, memory=256),
        gpu_request("mig", 1, mig_profile="1g.10gb", cpu=250, memory=256),
    ]
    granted, refused = [], []
    lock = threading.Lock()

    def client(i):
        tenant = tenants[i % 2]
        for attempt in range(12):
            request = shapes[(i + attempt) % len(shapes)]
            try:
                lease = services.lease_reserve(
                    pool=pool,
                    tenant=tenant,
                    request=request,
                    actor=SYSTEM,
                    duration=timedelta(minutes=5),
                )
            except services.NoCapacity as refusal:
                with lock:
                    refused.append(refusal.explanation)
            else:
                with lock:
                    granted.append(lease.pk)

    run_threads(16, client)
    assert granted and refused  # the pool ran out and someone lost
    for explanation in refused:
        assert explanation["code"] in ("no_capacity", "never_fits")
        assert explanation["reasons"] and explanation["message"]
    assert selectors.overcommitted_nodes(pool) == 0
    assert ledger_problems(pool) == []
    assert Lease.objects.filter(pool=pool, state=LeaseState.RESERVED).count() == len(granted)

    # and releasing everything concurrently brings the ledger back to zero
    ids = list(granted)

    def releaser(i):
        for pk in ids[i::8]:
            services.lease_release(
                lease=Lease.objects.get(pk=pk), actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT
            )

    run_threads(8, releaser)
    assert ledger_problems(pool) == []
    assert not Lease.objects.holding().filter(pool=pool).exists()


def test_release_expire_commit_race_on_one_lease(db):

    pool = build_pool("race2", exact_capacity=True)
    tenant = build_tenant("r", name="R")
    build_node(pool, "c1", cpu=64000, memory=65536)
    start = timezone.now()
    outcomes = []
    for _ in range(12):
        lease = services.lease_reserve(
            pool=pool,
            tenant=tenant,
            request=cpu_request(1000, 1024),
            actor=SYSTEM,
            duration=timedelta(minutes=1),
            now=start,
        )

        def act(i, lease=lease):
            try:
                if i == 0:
                    services.lease_release(
                        lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT
                    )
                elif i == 1:
                    services.expire_leases(now=start + timedelta(minutes=2))
                else:
                    services.lease_commit(
                        lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=start
                    )
            except TransitionRefused as refusal:
                assert refusal.code == "transition_not_allowed"

        run_threads(3, act)
        lease.refresh_from_db()
        assert lease.state in (LeaseState.RELEASED, LeaseState.EXPIRED)
        endings = LeaseEvent.objects.filter(
            lease=lease, to_state__in=[LeaseState.RELEASED, LeaseState.EXPIRED]
        )
        assert endings.count() == 1  # capacity was returned exactly once
        outcomes.append(lease.state)
        assert ledger_problems(pool) == []
    assert selectors.overcommitted_nodes(pool) == 0
