"""Credits: leases charged from held and consumed resources at the pool's per-class rates, each
interval once (two concurrent chargers on PostgreSQL too); without credit a tenant starts no
new work while its running work goes on; a policy admin's top-up lets it start again."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from config.builders import (
    SYSTEM,
    build_node,
    build_pool,
    build_priority_class,
    build_tenant,
    cpu_request,
    submit_job,
)
from leases import services
from leases.choices import LeaseState
from leases.models import Lease
from leases.services import credits, quota
from leases.services.usage import leases_record_usage
from pools.models import CreditAccount, CreditCharge
from pools.reasons import Reason
from pools.services import credit_top_up, policy_version_publish
from pools.statemachine import TransitionRefused

HOUR = timedelta(hours=1)
RATES = {
    "default": {"cpu_core_hour": 1, "memory_gib_hour": 0.5, "gpu_hour": 10, "consumed_factor": 0.5},
    "gold": {"cpu_core_hour": 3},
}


def price(pool, rates=RATES):
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=current.policy,
        weights=current.weights,
        knobs={**current.knobs, "credit_rates": rates},
        actor=SYSTEM,
    )


def reserve(pool, tenant, request=None, **kw):
    kw.setdefault("duration", 24 * HOUR)
    return services.lease_reserve(
        pool=pool, tenant=tenant, request=request or cpu_request(2000, 4096), actor=SYSTEM, **kw
    )


def running(lease, node, *, cpu=1000, memory=2048):
    lease = services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM)
    usage = {"cpu_millicores": cpu, "memory_mib": memory}
    leases_record_usage(node=node, workloads=[{"lease": lease.pk, "usage": usage}])
    return lease


def test_a_lease_is_charged_held_plus_consumed_once_per_interval(lpool, ltenant, lnode):
    price(lpool)
    t0 = timezone.now() - 4 * HOUR
    account = CreditAccount.objects.create(
        tenant=ltenant, pool=lpool, balance=Decimal(100), created_at=t0
    )
    lease = running(reserve(lpool, ltenant, now=t0), lnode)
    # held 2 cores × 1 + 4 GiB × 0.5 = 4/h; consumed (1 core, 2 GiB) = 2/h at half: 1/h
    assert credits.charge_credits(now=t0 + 2 * HOUR) == 1
    account.refresh_from_db()
    assert account.balance == Decimal(90)
    charge = CreditCharge.objects.get()
    assert (charge.amount, charge.balance_after, charge.lease_id) == (10, 90, lease.pk)
    assert (charge.period_start, charge.period_end) == (t0, t0 + 2 * HOUR)
    assert charge.held == {"cpu_cores": 2.0, "memory_gib": 4.0, "gpus": 0.0}
    assert charge.consumed == {"cpu_cores": 1.0, "memory_gib": 2.0, "gpus": 0.0}
    # the same moment again charges nothing; later, only the time since
    assert credits.charge_credits(now=t0 + 2 * HOUR) == 0
    services.lease_release(
        lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=t0 + 3 * HOUR
    )
    assert credits.charge_credits(now=t0 + 4 * HOUR) == 1  # the ended lease's last hour
    assert credits.charge_credits(now=t0 + 4 * HOUR) == 0
    account.refresh_from_db()
    assert account.balance == Decimal(85)
    periods = CreditCharge.objects.order_by("period_start").values_list("period_end", flat=True)
    assert list(periods) == [t0 + 2 * HOUR, t0 + 3 * HOUR]


def test_priority_class_rates_override_the_default(lpool, ltenant, lnode):
    price(lpool)
    gold = build_priority_class("gold", 100)
    t0 = timezone.now() - 2 * HOUR
    CreditAccount.objects.create(tenant=ltenant, pool=lpool, balance=Decimal(100), created_at=t0)
    job = submit_job(lpool, ltenant, priority=gold)
    reserve(lpool, ltenant, job=job, now=t0)  # held only: no usage reported
    credits.charge_credits(now=t0 + HOUR)
    charge = CreditCharge.objects.get()
    assert charge.priority_class == "gold"
    assert charge.amount == Decimal(8)  # 2 cores × 3 + 4 GiB × 0.5


def test_no_rates_or_no_account_charges_nothing(lpool, ltenant, ltenant2, lnode):
    t0 = timezone.now() - HOUR
    CreditAccount.objects.create(tenant=ltenant, pool=lpool, balance=Decimal(5), created_at=t0)
    reserve(lpool, ltenant, now=t0)
    assert credits.charge_credits() == 0  # the pool prices nothing
    price(lpool)
    reserve(lpool, ltenant2, now=t0)
    assert credits.charge_credits() == 1  # ltenant's lease; ltenant2 has no account
    assert CreditCharge.objects.get().account.tenant == ltenant


def test_one_bad_lease_never_stops_the_others(lpool, ltenant, lnode):
    price(lpool)
    t0 = timezone.now() - HOUR
    CreditAccount.objects.create(tenant=ltenant, pool=lpool, balance=Decimal(5), created_at=t0)
    bad = reserve(lpool, ltenant, cpu_request(1000, 1024), now=t0)
    good = reserve(lpool, ltenant, cpu_request(1000, 1024), now=t0)
    # a row written around the services: its usage cannot be priced
    Lease.objects.filter(pk=bad.pk).update(usage_average={"cpu_millicores": "not a number"})
    assert credits.charge_credits(now=t0 + HOUR) == 1
    assert bad.events.filter(reason=Reason.SWEEP_FAILED).exists()
    assert CreditCharge.objects.get().lease_id == good.pk
    assert CreditAccount.objects.get().balance == Decimal("3.5")  # 1 core + 1 GiB × 0.5


def test_without_credit_new_work_is_refused_and_running_work_goes_on(lpool, ltenant, lnode):
    price(lpool)
    t0 = timezone.now() - 2 * HOUR
    account = CreditAccount.objects.create(
        tenant=ltenant, pool=lpool, balance=Decimal(3), created_at=t0
    )
    lease = running(reserve(lpool, ltenant, now=t0), lnode)
    credits.charge_credits(now=t0 + HOUR)  # 5 > 3: the balance goes below zero
    account.refresh_from_db()
    assert account.balance == Decimal(-2)
    with pytest.raises(TransitionRefused) as caught:
        reserve(lpool, ltenant)
    assert caught.value.code == "credit_exhausted"
    blocked = services.tenants_at_quota(pool_id=lpool.pk)
    assert blocked[(ltenant.pk, lpool.pk)]["code"] == "credit_exhausted"
    room = quota.quota_headroom(lpool.pk, [ltenant.pk])[ltenant.pk]
    message = room.take(cpu_millicores=1, memory_mib=1, gpus=0)
    assert room.explanation(message)["code"] == "credit_exhausted"
    # the running lease is untouched and may still renew
    lease.refresh_from_db()
    assert lease.state == LeaseState.COMMITTED
    services.lease_renew(
        lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, duration=HOUR
    )
    # a top-up (with its ledger row) lets the tenant start work again
    credit_top_up(account, Decimal(10), by="padmin", note="monthly")
    assert CreditCharge.objects.filter(kind="top_up", amount=10, balance_after=8).exists()
    reserve(lpool, ltenant)
    assert services.tenants_at_quota(pool_id=lpool.pk) == {}


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_chargers_charge_each_interval_once():
    pool = build_pool("credit-race", exact_capacity=True)
    tenant = build_tenant("payer", name="Payer")
    build_node(pool, "c1", cpu=16000, memory=65536)
    price(pool)
    t0 = timezone.now() - 3 * HOUR
    CreditAccount.objects.create(tenant=tenant, pool=pool, balance=Decimal(1000), created_at=t0)
    for _ in range(3):
        reserve(pool, tenant, now=t0)
    now = t0 + HOUR
    barrier, counts, errors = threading.Barrier(2), [], []

    def charge():
        try:
            barrier.wait()
            counts.append(credits.charge_credits(now=now))
        except Exception as exc:  # surfaced below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=charge) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and sum(counts) == 3
    assert CreditCharge.objects.count() == 3
    # each lease held 2 cores and 4 GiB for an hour: 4 credits each, charged once
    assert CreditAccount.objects.get().balance == Decimal(1000 - 3 * 4)


def test_a_top_up_in_the_admin_writes_its_ledger_row(client, lpool, ltenant):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", password="pw")
    client.force_login(admin)
    account = CreditAccount.objects.create(tenant=ltenant, pool=lpool)
    url = f"/admin/pools/creditaccount/{account.pk}/change/"
    assert client.get(url).status_code == 200
    response = client.post(url, {"top_up": "25", "top_up_note": "grant", **_no_inline()})
    assert response.status_code == 302, response.content[:2000]
    account.refresh_from_db()
    assert account.balance == Decimal(25)
    top_up = CreditCharge.objects.get()
    assert (top_up.kind, top_up.amount, top_up.note) == ("top_up", 25, "user:root: grant")
    assert client.get(f"/admin/pools/creditcharge/{top_up.pk}/change/").status_code == 200


def _no_inline() -> dict:
    prefix = "charges"
    return {
        f"{prefix}-TOTAL_FORMS": "0",
        f"{prefix}-INITIAL_FORMS": "0",
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "0",
    }


def test_a_backfill_needs_credit_and_is_charged_to_its_own_tenant(lpool, ltenant, ltenant2, lnode):
    """Backfill went round the credit check (a tenant with none got 12 leases); it is charged
    like any placement, to the tenant whose work it is, never the reservation's owner."""
    price(lpool)
    t0 = timezone.now() - timedelta(minutes=10)
    window = services.Window(t0 + 6 * HOUR, t0 + 7 * HOUR, timedelta(minutes=5))
    held = reserve(lpool, ltenant, cpu_request(4000, 8192), window=window, now=t0)
    broke = CreditAccount.objects.create(
        tenant=ltenant2, pool=lpool, balance=Decimal(0), created_at=t0
    )
    with pytest.raises(TransitionRefused) as caught:
        reserve(lpool, ltenant2, cpu_request(1000, 1024), duration=2 * HOUR, now=t0)
    assert caught.value.code == "credit_exhausted"
    credit_top_up(broke, Decimal(10), by="padmin", note="top-up")
    backfill = reserve(lpool, ltenant2, cpu_request(1000, 1024), duration=2 * HOUR, now=t0)
    assert backfill.backfill_of_id == held.pk
    running(backfill, lnode, memory=1024)
    credits.charge_credits(now=t0 + HOUR)
    charges = CreditCharge.objects.filter(kind=CreditCharge.Kind.CHARGE)
    assert {(c.lease_id, c.account_id) for c in charges} == {(backfill.pk, broke.pk)}
    broke.refresh_from_db()
    assert broke.balance < Decimal(10)  # the reservation's owner has no account to charge
