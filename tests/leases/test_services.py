"""Lease services: reserve/commit/renew/release, refusals, quota, reservations, backfill."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, cpu_request, gpu_request
from leases import selectors, services
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from nodes.services import node_drain
from pools.actors import Actor
from pools.models import Quota
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

MIN = timedelta(minutes=1)


def reserve(pool, tenant, request=None, **kw):
    kw.setdefault("duration", 5 * MIN)
    return services.lease_reserve(
        pool=pool, tenant=tenant, request=request or cpu_request(), actor=SYSTEM, **kw
    )


def test_reserve_takes_capacity_and_release_returns_it(lpool, ltenant, lnode):
    lease = reserve(lpool, ltenant, cpu_request(1500, 2048, 100))
    lnode.refresh_from_db()
    assert (lnode.cpu_millicores_reserved, lnode.memory_mib_reserved) == (1500, 2048)
    assert lnode.scratch_mib_reserved == 100
    assert lease.state == LeaseState.RESERVED and lease.node_id == lnode.pk
    assert lease.events.get().reason == Reason.RESERVED
    assert ledger_problems(lpool) == []
    services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 0 and lnode.memory_mib_reserved == 0
    # idempotent: a second release changes nothing and writes no event
    again = services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    assert again.state == LeaseState.RELEASED
    assert lease.events.count() == 2
    assert ledger_problems(lpool) == []


def test_reserved_lease_and_event_are_stored_exactly_as_returned(lpool, ltenant, lnode, member):
    """The reserve statement sends its rows as one JSON document: every column must come back
    from the database as the caller saw it (timestamps to the microsecond, JSON, nulls)."""
    now = timezone.now().replace(microsecond=123456)
    actor = Actor.for_user(member)
    lease = services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=cpu_request(1500, 2048, 100),
        actor=actor,
        duration=timedelta(seconds=90.5),
        now=now,
    )
    stored = Lease.objects.get(pk=lease.pk)
    for field in Lease._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(lease, field.attname), field.name
    assert stored.expires_at == now + timedelta(seconds=90.5)
    assert stored.created_by_id == member.pk and stored.job_id is None
    assert stored.request == cpu_request(1500, 2048, 100)
    event = stored.events.get()
    assert (event.at, event.actor_user_id, event.to_state) == (now, member.pk, "reserved")
    assert event.data == {"node": lnode.name, "score": lease.placement["score"]}


def test_preferred_is_granted_when_free(lpool, ltenant, lnode):
    lease = reserve(lpool, ltenant, cpu_request(1000, 1024, cpu_millicores_preferred=2000))
    assert lease.cpu_millicores == 2000
    assert lease.placement["grants"]["cpu_millicores"]["granted"] == 2000


def test_no_capacity_explains_with_counts_and_nearest_miss(lpool, ltenant, lnode):
    build_node(lpool, "n2", cpu=2000, memory=4096)
    drained = build_node(lpool, "n3", cpu=8000, memory=16384)
    node_drain(node=drained, actor=SYSTEM)
    reserve(lpool, ltenant, cpu_request(3000, 1024))
    with pytest.raises(services.NoCapacity) as caught:
        reserve(lpool, ltenant, cpu_request(2500, 1024))
    refusal = caught.value
    assert refusal.status == 409 and not isinstance(refusal, services.NeverFits)
    assert refusal.explanation["total_nodes"] == 3
    assert refusal.explanation["reasons"] == {
        "insufficient_cpu": 2,
        "node_not_schedulable(draining)": 1,
    }
    assert refusal.explanation["nearest_miss"]["node"] in ("n1", "n2")
    assert "0 of 3 nodes" in refusal.explanation["message"]


def test_never_fits_is_422(lpool, ltenant, lnode):
    with pytest.raises(services.NeverFits) as caught:
        reserve(lpool, ltenant, cpu_request(64_000, 1024))
    assert caught.value.status == 422
    assert caught.value.explanation["code"] == "never_fits"
    with pytest.raises(services.NeverFits):
        reserve(lpool, ltenant, gpu_request())  # no GPU anywhere in the pool


def test_draining_node_gets_no_new_lease_but_release_works(lpool, ltenant, lnode):
    lease = reserve(lpool, ltenant)
    node_drain(node=lnode, actor=SYSTEM)
    with pytest.raises(services.NoCapacity):
        reserve(lpool, ltenant)
    services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    assert ledger_problems(lpool) == []


def test_idempotency_key_returns_the_same_lease(lpool, ltenant, lnode):
    first = reserve(lpool, ltenant, idempotency_key="abc")
    second = reserve(lpool, ltenant, idempotency_key="abc")
    assert first.pk == second.pk
    assert Lease.objects.count() == 1
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 1000


def test_quota_is_enforced(lpool, ltenant, lnode):
    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=2000, memory_mib=10**6)
    reserve(lpool, ltenant)
    reserve(lpool, ltenant)
    with pytest.raises(TransitionRefused) as caught:
        reserve(lpool, ltenant)
    assert caught.value.code == "quota_exceeded"
    assert ledger_problems(lpool) == []


def test_exclusive_gpus_timeslice_shares_and_mig_slices(lpool, ltenant, ltenant2):
    build_node(lpool, "g1", cpu=32000, memory=65536, gpus=[{}, {}])
    build_node(lpool, "ts", cpu=32000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])
    build_node(lpool, "mig", cpu=32000, memory=65536, gpus=[{"mig_enabled": True}])
    whole = reserve(lpool, ltenant, gpu_request("exclusive", 2))
    assert whole.node.name == "g1" and [a["milli"] for a in whole.gpu_allocations] == [1000] * 2
    half = reserve(lpool, ltenant, gpu_request("timeslice", 1, 500))
    assert half.node.name == "ts"
    reserve(lpool, ltenant, gpu_request("timeslice", 1, 500))
    with pytest.raises(services.NoCapacity):  # the device is full
        reserve(lpool, ltenant, gpu_request("timeslice", 1, 100))
    services.lease_release(lease=half, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    with pytest.raises(services.NoCapacity) as caught:  # the other tenant may not mix in
        reserve(lpool, ltenant2, gpu_request("timeslice", 1, 100))
    assert "tenant_mixing_refused" in caught.value.explanation["reasons"]
    slices = [reserve(lpool, ltenant, gpu_request("mig", 1, mig_profile="3g.40gb"))]
    slices.append(reserve(lpool, ltenant2, gpu_request("mig", 1, mig_profile="3g.40gb")))
    masks = [s.gpu_allocations[0]["mig_slots"] for s in slices]
    assert masks[0] & masks[1] == 0
    with pytest.raises(services.NoCapacity) as caught:
        reserve(lpool, ltenant, gpu_request("mig", 1, mig_profile="1g.10gb"))
    # the refusal says which slice to wait for: the one that ends first
    assert caught.value.explanation["nearest_miss"]["after_leases"] == [str(slices[0].pk)]
    assert ledger_problems(lpool) == []
    for s in slices:
        services.lease_release(lease=s, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    assert ledger_problems(lpool) == []


def test_commit_renew_and_fencing(lpool, ltenant, lnode):
    now = timezone.now()
    lease = reserve(lpool, ltenant, now=now)
    with pytest.raises(TransitionRefused) as caught:
        services.lease_commit(lease=lease, fencing_token=lease.fencing_token + 1, actor=SYSTEM)
    assert caught.value.code == "fencing_token_mismatch"
    lease = services.lease_commit(
        lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=now + MIN
    )
    assert lease.state == LeaseState.COMMITTED and lease.committed_at == now + MIN
    renewed = services.lease_renew(
        lease=lease,
        fencing_token=lease.fencing_token,
        actor=SYSTEM,
        duration=10 * MIN,
        now=now + 2 * MIN,
    )
    assert renewed.expires_at == now + 12 * MIN
    assert renewed.events.last().reason == Reason.RENEWED
    with pytest.raises(TransitionRefused) as caught:  # past expiry: refused with a reason
        services.lease_renew(
            lease=lease,
            fencing_token=lease.fencing_token,
            actor=SYSTEM,
            duration=MIN,
            now=now + 13 * MIN,
        )
    assert caught.value.code == "lease_expired"


def test_node_principal_acts_only_on_its_own_node(lpool, ltenant, lnode):
    from pools.actors import Actor

    other = build_node(lpool, "n2")
    lease = reserve(lpool, ltenant)
    with pytest.raises(TransitionRefused) as caught:
        services.lease_commit(
            lease=lease, fencing_token=lease.fencing_token, actor=Actor.for_node(other)
        )
    assert caught.value.code == "not_your_lease"
    services.lease_commit(
        lease=lease, fencing_token=lease.fencing_token, actor=Actor.for_node(lnode)
    )


def test_sweeps_expire_and_return_capacity(lpool, ltenant, lnode):
    now = timezone.now()
    stale = reserve(lpool, ltenant, now=now, duration=MIN)
    running = reserve(lpool, ltenant, now=now, duration=MIN)
    services.lease_commit(lease=running, fencing_token=running.fencing_token, actor=SYSTEM, now=now)
    fresh = reserve(lpool, ltenant, now=now, duration=10 * MIN)
    assert services.expire_leases(now=now + 2 * MIN) == 2
    assert services.expire_leases(now=now + 2 * MIN) == 0  # a second sweep finds nothing
    stale.refresh_from_db()
    running.refresh_from_db()
    assert stale.state == running.state == LeaseState.EXPIRED
    assert stale.events.last().reason == Reason.EXPIRED_UNCOMMITTED
    assert running.events.last().reason == Reason.EXPIRED_NOT_RENEWED
    fresh.refresh_from_db()
    assert fresh.state == LeaseState.RESERVED
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 1000
    assert ledger_problems(lpool) == []


def test_uncertain_then_reconciled_or_deadline(lpool, ltenant, lnode):
    now = timezone.now()
    a, b, c = (reserve(lpool, ltenant, now=now) for _ in range(3))
    for lease in (a, b, c):
        services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=now)
        services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=now)
    a = services.lease_reconcile(lease=a, running=True, actor=SYSTEM, now=now + MIN)
    assert a.state == LeaseState.COMMITTED and a.uncertain_since is None
    b = services.lease_reconcile(lease=b, running=False, actor=SYSTEM, now=now + MIN)
    assert b.state == LeaseState.RELEASED and b.events.last().reason == Reason.RECONCILED_GONE
    assert services.expire_uncertain(now=now + 5 * MIN, deadline=10 * MIN) == 0
    assert services.expire_uncertain(now=now + 11 * MIN, deadline=10 * MIN) == 1
    c.refresh_from_db()
    assert c.state == LeaseState.EXPIRED and c.events.last().reason == Reason.UNCERTAIN_DEADLINE
    assert ledger_problems(lpool) == []


def test_reservation_window_claim_and_unclaimed_release(lpool, ltenant, lnode):
    now = timezone.now()
    window = services.Window(now + 60 * MIN, now + 120 * MIN, 5 * MIN)
    held = reserve(lpool, ltenant, cpu_request(4000, 1024), window=window, now=now)
    assert held.is_reservation and held.expires_at == now + 65 * MIN
    with pytest.raises(TransitionRefused) as caught:
        services.lease_commit(lease=held, fencing_token=held.fencing_token, actor=SYSTEM, now=now)
    assert caught.value.code == "reservation_window_not_open"
    # the expiry sweep leaves reservations to the reservation sweep
    assert services.expire_leases(now=now + 70 * MIN) == 0
    assert services.release_unclaimed_reservations(now=now + 64 * MIN) == 0
    assert services.release_unclaimed_reservations(now=now + 66 * MIN) == 1
    held.refresh_from_db()
    assert held.state == LeaseState.RELEASED
    assert held.events.last().reason == Reason.RESERVATION_UNCLAIMED
    assert ledger_problems(lpool) == []

    claimed = reserve(lpool, ltenant, cpu_request(4000, 1024), window=window, now=now)
    claimed = services.lease_commit(
        lease=claimed, fencing_token=claimed.fencing_token, actor=SYSTEM, now=now + 61 * MIN
    )
    assert claimed.state == LeaseState.COMMITTED and claimed.expires_at == window.end
    with pytest.raises(TransitionRefused) as caught:
        services.lease_renew(
            lease=claimed,
            fencing_token=claimed.fencing_token,
            actor=SYSTEM,
            duration=120 * MIN,
            now=now + 119 * MIN,
        )
    assert caught.value.code == "hold_cap_reached"


def test_reservation_policy_caps(lpool, ltenant, lnode):
    now = timezone.now()
    with pytest.raises(TransitionRefused) as caught:
        reserve(lpool, ltenant, window=(now + timedelta(days=30), now + timedelta(days=31)))
    assert caught.value.code == "reservation_horizon_exceeded"
    with pytest.raises(TransitionRefused) as caught:
        reserve(lpool, ltenant, window=(now + MIN, now + timedelta(days=3)))
    assert caught.value.code == "reservation_hold_exceeded"


def test_backfill_runs_on_reserved_capacity_until_the_window(lpool, ltenant, ltenant2, lnode):
    now = timezone.now()
    window = services.Window(now + 60 * MIN, now + 120 * MIN, 5 * MIN)
    held = reserve(lpool, ltenant, cpu_request(4000, 8192), window=window, now=now)
    # too long to end before the window: no capacity
    with pytest.raises(services.NoCapacity):
        reserve(lpool, ltenant2, cpu_request(1000, 1024), duration=90 * MIN, now=now)
    short = reserve(lpool, ltenant2, cpu_request(1000, 1024), duration=30 * MIN, now=now)
    assert short.backfill_of_id == held.pk and short.node_id == held.node_id
    lnode.refresh_from_db()
    assert lnode.cpu_millicores_reserved == 4000  # the backfill borrows, the ledger is unchanged
    assert ledger_problems(lpool) == []
    services.lease_commit(lease=short, fencing_token=short.fencing_token, actor=SYSTEM, now=now)
    clamped = services.lease_renew(
        lease=short,
        fencing_token=short.fencing_token,
        actor=SYSTEM,
        duration=60 * MIN,
        now=now + 29 * MIN,
    )
    assert clamped.expires_at == window.start  # clamped to the window's opening
    with pytest.raises(TransitionRefused) as caught:  # nothing left to extend
        services.lease_renew(
            lease=short,
            fencing_token=short.fencing_token,
            actor=SYSTEM,
            duration=60 * MIN,
            now=now + 59 * MIN,
        )
    assert caught.value.code == "hold_cap_reached"
    services.lease_commit(
        lease=held, fencing_token=held.fencing_token, actor=SYSTEM, now=now + 60 * MIN
    )
    short.refresh_from_db()
    assert short.state == LeaseState.EXPIRED
    assert short.events.last().reason == Reason.BACKFILL_WINDOW_CLOSED
    assert ledger_problems(lpool) == []


def test_accounting_held_vs_consumed_and_capacity(lpool, ltenant, lnode, cpu_shape_in):
    lease = reserve(lpool, ltenant, cpu_request(2000, 2048))
    services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM)
    services.lease_report_usage(lease=lease, actor=SYSTEM, cpu_millicores=1500, memory_mib=1000)
    report = selectors.tenant_accounting(ltenant, lpool)
    assert report["held"]["cpu_millicores"] == 2000 and report["held"]["leases"] == 1
    assert report["consumed"]["cpu_millicores"] == 1500
    capacity = selectors.pool_capacity(lpool)
    row = capacity["nodes"][0]
    assert row["reserved"]["cpu_millicores"] == 2000 and row["used"]["cpu_millicores"] == 1500
    assert row["free"]["cpu_millicores"] == 2000
    assert row["fragmented"]["cpu_millicores"] == 0
    reserve(lpool, ltenant, cpu_request(1500, 1024))  # 500 m left: the 1-core shape won't fit
    row = selectors.pool_capacity(lpool)["nodes"][0]
    assert row["fragmented"]["cpu_millicores"] == 500


@pytest.fixture
def cpu_shape_in(lpool):
    from pools.models import ResourceShape

    return ResourceShape.objects.create(
        pool=lpool, name="one-core", cpu_millicores_min=1000, memory_mib_min=1024
    )


def test_a_person_cannot_release_a_live_jobs_lease_cancelling_the_job_ends_it(
    lpool, ltenant, lnode, lmember
):
    """Releasing a running job's lease gave its capacity back while the container ran, and the
    job then ended `lost`/`node_lost`, which was untrue. Cancel is the way."""
    from config.builders import submit_job
    from jobs.services import job_cancel

    job = submit_job(lpool, ltenant, cpu=1000, memory=1024)
    lease = services.lease_reserve(
        pool=lpool, tenant=ltenant, request=cpu_request(), actor=SYSTEM, duration=60 * MIN, job=job
    )
    person = Actor.for_user(lmember)
    with pytest.raises(TransitionRefused) as caught:
        services.lease_release(lease=lease, actor=person, reason=Reason.RELEASED_BY_CLIENT)
    assert caught.value.code == "job_lease"
    lease.refresh_from_db()
    assert lease.state == LeaseState.RESERVED
    job_cancel(job=job, actor=person)
    lease.refresh_from_db()
    assert lease.state == LeaseState.RELEASED
    assert ledger_problems(lpool) == []
