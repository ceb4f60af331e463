"""The one sweep loop (pools/sweeps.py), on support grants (the kernel's own stateful rows): each
row in its own transaction, at most a batch, rows another worker holds or no longer due left
out, a failure recorded on its row and the sweep going on, a refused transition not done."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from pools.actors import Actor
from pools.choices import SUPPORT_GRANT_TRANSITIONS, SupportGrantState
from pools.models import SupportGrant, SupportGrantEvent
from pools.reasons import Reason
from pools.services import support_grant_create, support_grant_revoke
from pools.statemachine import transition
from pools.sweeps import sweep

SWEEPER = Actor.system("test-sweep")
ACTIVE = SupportGrant.objects.filter(state=SupportGrantState.ACTIVE)


@pytest.fixture
def grants(tenant, tenant_admin, operator):
    def grant(reason):
        return support_grant_create(
            tenant=tenant,
            operator="operator",
            ttl=timedelta(hours=1),
            reason=reason,
            actor=Actor.for_user(tenant_admin),
        )

    return [grant(f"ticket {i}") for i in range(3)]


def expire(grant):
    return transition(
        SupportGrant,
        grant.pk,
        to=SupportGrantState.EXPIRED,
        allowed=SUPPORT_GRANT_TRANSITIONS,
        event_model=SupportGrantEvent,
        actor=SWEEPER,
        reason=Reason.SUPPORT_EXPIRED,
        message="swept",
    ).state


def run(due, step, **options):
    return sweep(
        due, step, event_model=SupportGrantEvent, actor=SWEEPER, now=timezone.now(), **options
    )


def reasons(grant):
    return list(grant.events.order_by("id").values_list("reason", flat=True))


@pytest.mark.django_db
def test_a_failing_row_is_rolled_back_and_recorded_and_the_others_go_on(grants):
    first, bad, last = grants

    def step(grant):
        result = expire(grant)
        if grant.pk == bad.pk:
            raise ValueError("no such thing\nDETAIL: row values")
        return result

    assert run(ACTIVE, step) == {first.pk: "expired", last.pk: "expired"}
    bad.refresh_from_db()
    assert bad.state == SupportGrantState.ACTIVE  # its expiry rolled back with it
    assert reasons(bad) == [Reason.SUPPORT_GRANTED, Reason.SWEEP_FAILED]
    assert bad.events.last().message == "ValueError: no such thing"
    assert reasons(last) == [Reason.SUPPORT_GRANTED, Reason.SUPPORT_EXPIRED]


@pytest.mark.django_db
def test_a_refused_transition_is_not_done_and_not_a_failure(grants, tenant_admin):
    revoked = grants[1]
    support_grant_revoke(grant=revoked, actor=Actor.for_user(tenant_admin))
    everything = SupportGrant.objects.all()  # still "due": only the state machine refuses it

    done = run(everything, expire)

    assert sorted(done) == [grants[0].pk, grants[2].pk]
    assert reasons(revoked) == [Reason.SUPPORT_GRANTED, Reason.SUPPORT_REVOKED]


@pytest.mark.django_db
def test_at_most_a_batch_lowest_ids_first_the_next_sweep_takes_the_rest(grants):
    assert list(run(ACTIVE, expire, batch=2)) == [grants[0].pk, grants[1].pk]
    assert list(run(ACTIVE, expire, batch=2)) == [grants[2].pk]
    assert run(ACTIVE, expire, batch=2) == {}


@pytest.mark.django_db
def test_a_row_no_longer_due_when_its_turn_comes_is_left_out(grants, tenant_admin):
    def step(grant):
        if grant.pk == grants[0].pk:  # meanwhile, someone revokes the next one
            support_grant_revoke(grant=grants[1], actor=Actor.for_user(tenant_admin))
        return expire(grant)

    assert list(run(ACTIVE, step)) == [grants[0].pk, grants[2].pk]
    assert reasons(grants[1]) == [Reason.SUPPORT_GRANTED, Reason.SUPPORT_REVOKED]


@pytest.mark.django_db(transaction=True)
def test_a_row_another_worker_holds_is_left_to_it_without_waiting(grants):
    held = grants[1]
    result = {}

    def other_worker():
        try:
            result["done"] = run(ACTIVE, expire)
        finally:
            connection.close()

    with transaction.atomic():
        SupportGrant.objects.select_for_update().get(pk=held.pk)
        worker = threading.Thread(target=other_worker)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "the sweep waited on the held row"

    assert sorted(result["done"]) == [grants[0].pk, grants[2].pk]
    held.refresh_from_db()
    assert held.state == SupportGrantState.ACTIVE and reasons(held) == [Reason.SUPPORT_GRANTED]
    assert run(ACTIVE, expire) == {held.pk: "expired"}  # the next sweep, once it is free
