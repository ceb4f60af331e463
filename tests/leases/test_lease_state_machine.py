"""The lease lifecycle: every transition allowed and refused (with its event row), and a
hypothesis state machine driving reserve/commit/renew/release/expire/uncertain/reconcile/
stop/stopped in random order, checking the ledger invariant after every step."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from config.builders import SYSTEM, build_node, build_pool, build_tenant, cpu_request, gpu_request
from leases import selectors, services
from leases.choices import LEASE_TRANSITIONS, LeaseState
from leases.models import Lease, LeaseEvent
from leases.selectors import ledger_problems
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

S = LeaseState
MIN = timedelta(minutes=1)


def lease_in(state, pool, tenant, now):
    lease = services.lease_reserve(
        pool=pool, tenant=tenant, request=cpu_request(), actor=SYSTEM, duration=5 * MIN, now=now
    )
    if state in (S.COMMITTED, S.UNCERTAIN, S.STOPPING):
        services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=now)
    if state == S.UNCERTAIN:
        services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=now)
    if state == S.STOPPING:
        services.lease_stop(lease=lease, actor=SYSTEM, now=now)
    if state == S.RELEASED:
        services.lease_release(lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=now)
    if state == S.EXPIRED:
        services.expire_leases(now=now + 10 * MIN)
    lease.refresh_from_db()
    assert lease.state == state
    return lease


def drive(target, lease, now):
    """Ask the service that leads to `target`; True when it moved, False when it did nothing."""
    later = now + MIN
    if target == S.COMMITTED:
        if lease.state == S.UNCERTAIN:
            services.lease_reconcile(lease=lease, running=True, actor=SYSTEM, now=later)
        else:
            services.lease_commit(
                lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM, now=later
            )
    elif target == S.RELEASED and lease.state == S.STOPPING:
        services.lease_stopped(lease=lease, actor=SYSTEM, now=later)  # the agent's confirmation
    elif target == S.RELEASED:
        services.lease_release(
            lease=lease, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=later
        )
    elif target == S.UNCERTAIN and lease.state == S.STOPPING:
        # its node going silent keeps it stopping (lease_mark_uncertain): not this transition
        services.lease_transition(
            lease=lease, to=S.UNCERTAIN, actor=SYSTEM, reason=Reason.NODE_SILENT, now=later
        )
    elif target == S.UNCERTAIN:
        services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=later)
    elif target == S.STOPPING:
        services.lease_stop(lease=lease, actor=SYSTEM, now=later)
    elif target == S.EXPIRED:
        if lease.state == S.STOPPING:  # its node silent past the uncertain deadline
            services.lease_mark_uncertain(lease=lease, actor=SYSTEM, now=later)
        if lease.state in (S.UNCERTAIN, S.STOPPING):
            return services.expire_uncertain(now=now + 20 * MIN, deadline=10 * MIN) == 1
        return services.expire_leases(now=now + 20 * MIN) == 1
    return True


EXPECTED_REASON = {
    (S.RESERVED, S.COMMITTED): Reason.COMMITTED,
    (S.RESERVED, S.RELEASED): Reason.RELEASED_BY_CLIENT,
    (S.RESERVED, S.EXPIRED): Reason.EXPIRED_UNCOMMITTED,
    (S.COMMITTED, S.RELEASED): Reason.RELEASED_BY_CLIENT,
    (S.COMMITTED, S.UNCERTAIN): Reason.NODE_SILENT,
    (S.COMMITTED, S.EXPIRED): Reason.EXPIRED_NOT_RENEWED,
    (S.UNCERTAIN, S.COMMITTED): Reason.RECONCILED_RUNNING,
    (S.UNCERTAIN, S.RELEASED): Reason.RELEASED_BY_CLIENT,
    (S.UNCERTAIN, S.EXPIRED): Reason.UNCERTAIN_DEADLINE,
    (S.COMMITTED, S.STOPPING): Reason.STOP_REQUESTED,
    (S.UNCERTAIN, S.STOPPING): Reason.STOP_REQUESTED,
    (S.STOPPING, S.RELEASED): Reason.STOP_CONFIRMED,
    (S.STOPPING, S.EXPIRED): Reason.UNCERTAIN_DEADLINE,
}

PAIRS = [(a, b) for a in S.values for b in S.values if a != b and b != S.RESERVED]


@pytest.mark.parametrize("source, target", PAIRS)
def test_every_transition_allowed_or_refused(source, target, lpool, ltenant, lnode):
    now = timezone.now()
    lease = lease_in(source, lpool, ltenant, now)
    events_before = lease.events.count()
    allowed = target in LEASE_TRANSITIONS[source]
    assert allowed == ((source, target) in EXPECTED_REASON)
    if allowed:
        assert drive(target, lease, now)
        lease.refresh_from_db()
        assert lease.state == target
        event = lease.events.last()
        assert (event.from_state, event.to_state) == (source, target)
        assert event.reason == EXPECTED_REASON[(source, target)]
        assert event.actor_label.startswith("system:")
    else:
        try:
            moved = drive(target, lease, now)
        except TransitionRefused as refusal:
            assert refusal.code in ("transition_not_allowed", "lease_expired")
            moved = False
        assert not moved or target == S.RELEASED  # release of an ended lease is a no-op
        lease.refresh_from_db()
        assert lease.state == source
        assert lease.events.count() == events_before  # refused: no event row
    assert ledger_problems(lpool) == []


class LeaseMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    @initialize()
    def setup(self):
        tag = uuid.uuid4().hex[:8]
        self.pool = build_pool(f"sm-{tag}", exact_capacity=True)
        self.tenants = [build_tenant(f"sm-{tag}-{i}", name=f"sm {tag} {i}") for i in range(2)]
        build_node(self.pool, "a", cpu=3000, memory=6144)
        build_node(self.pool, "g", cpu=3000, memory=6144, gpus=[{"sharing_mode": "timeslice"}])
        self.now = timezone.now()
        self.shapes = [
            cpu_request(1000, 1024),
            cpu_request(2000, 4096),
            gpu_request("exclusive", 1, cpu=500, memory=512),
            gpu_request("timeslice", 1, 400, cpu=250, memory=256),
        ]

    @rule(
        target=leases,
        shape=st.integers(0, 3),
        tenant=st.integers(0, 1),
        minutes=st.integers(1, 10),
    )
    def reserve(self, shape, tenant, minutes):
        try:
            lease = services.lease_reserve(
                pool=self.pool,
                tenant=self.tenants[tenant],
                request=self.shapes[shape],
                actor=SYSTEM,
                duration=minutes * MIN,
                now=self.now,
            )
        except services.NoCapacity as refusal:
            assert refusal.explanation["reasons"]
            return None
        return lease.pk

    def _lease(self, pk):
        return Lease.objects.get(pk=pk) if pk else None

    def _try(self, fn, **kw):
        try:
            fn(**kw)
        except TransitionRefused as refusal:
            assert refusal.code in (
                "transition_not_allowed",
                "lease_expired",
                "fencing_token_mismatch",
                "hold_cap_reached",
                "not_committed",  # a reserved lease of the lease API renews only once committed
            )

    @rule(pk=leases, stale=st.booleans())
    def commit(self, pk, stale):
        lease = self._lease(pk)
        if lease:
            token = lease.fencing_token + (1 if stale else 0)
            self._try(
                services.lease_commit, lease=lease, fencing_token=token, actor=SYSTEM, now=self.now
            )

    @rule(pk=leases, minutes=st.integers(1, 10))
    def renew(self, pk, minutes):
        lease = self._lease(pk)
        if lease:
            self._try(
                services.lease_renew,
                lease=lease,
                fencing_token=lease.fencing_token,
                actor=SYSTEM,
                duration=minutes * MIN,
                now=self.now,
            )

    @rule(pk=leases)
    def release(self, pk):
        lease = self._lease(pk)
        if lease:  # a stopping lease refuses: only its stop ends it
            self._try(
                services.lease_release,
                lease=lease,
                actor=SYSTEM,
                reason=Reason.RELEASED_BY_CLIENT,
                now=self.now,
            )

    @rule(pk=leases)
    def stop(self, pk):
        lease = self._lease(pk)
        if lease:
            self._try(services.lease_stop, lease=lease, actor=SYSTEM, now=self.now)

    @rule(pk=leases)
    def stopped(self, pk):
        lease = self._lease(pk)
        if lease:
            self._try(services.lease_stopped, lease=lease, actor=SYSTEM, now=self.now)

    @rule(pk=leases)
    def uncertain(self, pk):
        lease = self._lease(pk)
        if lease:
            self._try(services.lease_mark_uncertain, lease=lease, actor=SYSTEM, now=self.now)

    @rule(pk=leases, running=st.booleans())
    def reconcile(self, pk, running):
        lease = self._lease(pk)
        if lease:
            self._try(
                services.lease_reconcile, lease=lease, running=running, actor=SYSTEM, now=self.now
            )

    @rule(minutes=st.integers(1, 8))
    def tick(self, minutes):
        self.now += minutes * MIN

    @rule()
    def expire(self):
        services.expire_leases(now=self.now)

    @rule(deadline=st.integers(0, 5))
    def expire_uncertain(self, deadline):
        services.expire_uncertain(now=self.now, deadline=deadline * MIN)

    @invariant()
    def ledger_equals_live_leases(self):
        if not hasattr(self, "pool"):
            return
        assert selectors.ledger_problems(self.pool) == []
        assert selectors.overcommitted_nodes(self.pool) == 0

    @invariant()
    def event_chains_follow_the_map(self):
        if not hasattr(self, "pool"):
            return
        chains = {}
        for event in LeaseEvent.objects.filter(lease__pool=self.pool).order_by("id"):
            chains.setdefault(event.lease_id, []).append(event)
        for lease in Lease.objects.filter(pool=self.pool):
            events = chains[lease.pk]
            state = ""
            for event in events:
                assert event.from_state == state
                if event.from_state != event.to_state:  # renewals keep the state
                    assert not state or event.to_state in LEASE_TRANSITIONS[state]
                state = event.to_state
            assert state == lease.state


@pytest.mark.django_db
def test_lease_state_machine():
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            derandomize=True,
        ),
    )
