from datetime import timedelta

import pytest

from jobs.choices import JobState
from leases.choices import LeaseState
from nodes import services
from nodes.choices import NODE_TRANSITIONS, GpuHealth, NodeState, ProbeState, Reachability
from nodes.models import GpuDevice, Node, NodeCredential, NodeEvent
from pools.actors import Actor
from pools.models import token_digest
from pools.reasons import Reason
from pools.services import policy_version_publish
from pools.statemachine import TransitionRefused

from .conftest import SYSTEM, inventory

S = NodeState


def reasons(node):
    return list(NodeEvent.objects.filter(node=node).values_list("reason", flat=True))


def last_event(node):
    return NodeEvent.objects.filter(node=node).last()


# --------------------------------------------------------------------------- capacity


def test_allocatable_is_raw_minus_reserve_minus_margin(private_pool):
    alloc = services.allocatable_from_raw(
        private_pool, cpu_millicores=64000, memory_mib=512000, scratch_mib=1000
    )
    # reserve 500m / 1024 MiB, margin 5 %
    assert alloc == {
        "cpu_millicores_allocatable": int((64000 - 500) * 0.95),
        "memory_mib_allocatable": int((512000 - 1024) * 0.95),
        "scratch_mib_allocatable": 950,
    }


# --------------------------------------------------------------------------- enrollment


def test_enroll_private_node_registers_with_inventory_and_credential(enroll, private_pool):
    enrolled = enroll(private_pool)
    node = enrolled.node
    assert node.state == S.REGISTERED
    assert reasons(node) == [Reason.ENROLLED]
    assert node.gpus.count() == 2
    gpu = node.gpus.get(index=0)
    assert (gpu.model, gpu.memory_mib, gpu.cuda_version) == ("NVIDIA H100 80GB HBM3", 81559, "12.4")
    assert node.inventory["cpu_millicores"] == 64000
    assert node.cpu_millicores_allocatable < node.cpu_millicores_raw
    assert node.identity_fingerprint and "ssh" not in node.identity_fingerprint
    assert enrolled.secret.startswith("cpn_")
    credential = NodeCredential.objects.get(node=node)
    assert credential.digest == token_digest(enrolled.secret)
    assert enrolled.secret not in str(NodeCredential.objects.values_list())
    assert enrolled.probe is None
    assert node.enrollment_token.uses == 1


def test_enroll_refuses_unknown_expired_revoked_and_used_up_tokens(private_pool, operator, now):
    actor = Actor.for_user(operator)

    def attempt(secret, name, at=None):
        return services.node_enroll(
            secret=secret, name=name, inventory=inventory(gpus=0), now=at or now
        )

    with pytest.raises(services.EnrollmentRefused, match="Unknown"):
        attempt("cpe_nope", "a")

    token, secret = services.enrollment_token_issue(
        pool=private_pool, actor=actor, ttl=timedelta(hours=1), now=now
    )
    with pytest.raises(services.EnrollmentRefused, match="expired"):
        attempt(secret, "late", at=now + timedelta(hours=1, seconds=1))

    token, secret = services.enrollment_token_issue(pool=private_pool, actor=actor, max_uses=2)
    attempt(secret, "one")
    attempt(secret, "two")
    with pytest.raises(services.EnrollmentRefused, match="used up"):
        attempt(secret, "three")
    token.refresh_from_db()
    assert token.uses == 2

    token, secret = services.enrollment_token_issue(pool=private_pool, actor=actor, max_uses=5)
    services.enrollment_token_revoke(token=token)
    with pytest.raises(services.EnrollmentRefused, match="revoked"):
        attempt(secret, "four")
    assert set(Node.objects.values_list("name", flat=True)) == {"one", "two"}


def test_private_node_first_authenticated_heartbeat_verifies_and_readies(enroll, private_pool):
    enrolled = enroll(private_pool)
    node = services.node_heartbeat(node=enrolled.node, actor=Actor.for_node(enrolled.node))
    assert node.state == S.READY
    events = list(NodeEvent.objects.filter(node=node).values_list("from_state", "to_state"))
    assert events == [("", S.REGISTERED), (S.REGISTERED, S.VERIFIED), (S.VERIFIED, S.READY)]
    assert reasons(node)[1:] == [Reason.AGENT_AUTHENTICATED, Reason.AGENT_AUTHENTICATED]
    assert last_event(node).actor_label == f"node:{node.name}"
    # further heartbeats change nothing
    services.node_heartbeat(node=node, actor=Actor.for_node(node))
    assert NodeEvent.objects.filter(node=node).count() == 3


# --------------------------------------------------------------------------- probes


def measured(node, **overrides):
    claims = node.inventory
    result = {
        "cpu_count": claims["cpu_millicores"] // 1000,
        "memory_mib": claims["memory_mib"] - 2000,  # a container sees a little less
        "gpus": [
            {"uuid": g["uuid"], "model": g["model"], "memory_mib": g["memory_mib"]}
            for g in claims["gpus"]
        ],
        "benchmark": {"matmul_tflops": 612.0},
    }
    return result | overrides


def test_marketplace_node_needs_a_probe_and_passes(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    assert enrolled.probe.state == ProbeState.REQUESTED
    assert reasons(node) == [Reason.ENROLLED, Reason.PROBE_REQUESTED]
    # an authenticated heartbeat alone is not enough in a marketplace
    node = services.node_heartbeat(node=node, actor=Actor.for_node(node))
    assert node.state == S.REGISTERED
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(node)
    )
    assert probe.state == ProbeState.PASSED and probe.differences == []
    node.refresh_from_db()
    assert node.state == S.READY
    assert reasons(node)[-2:] == [Reason.PROBE_PASSED, Reason.PROBE_PASSED]


def test_probe_mismatch_quarantines_with_the_difference(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    result = measured(node)
    result["gpus"][1]["model"] = "NVIDIA GeForce RTX 4090"
    result["cpu_count"] = 16
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert probe.state == ProbeState.FAILED
    node.refresh_from_db()
    assert node.state == S.QUARANTINED
    event = last_event(node)
    assert event.reason == Reason.PROBE_MISMATCH
    assert "RTX 4090" in event.message and "cpu: claimed 64000m, measured 16000m" in event.message
    assert event.data["differences"] == probe.differences


def test_probe_missing_benchmark_or_gpu_is_a_mismatch(enroll, market_pool):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node, benchmark={})
    result["gpus"].pop()
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert any("not seen" in d for d in probe.differences)
    assert "benchmark: no result" in probe.differences


def test_probe_result_only_from_that_nodes_credential_and_only_once(enroll, market_pool):
    first, second = enroll(market_pool), enroll(market_pool)
    with pytest.raises(services.NodeScopeRefused):
        services.probe_result_submit(
            probe=first.probe, credential=second.credential, result=measured(first.node)
        )
    first.probe.refresh_from_db()
    assert first.probe.state == ProbeState.REQUESTED
    services.probe_result_submit(
        probe=first.probe, credential=first.credential, result=measured(first.node)
    )
    with pytest.raises(TransitionRefused) as refused:
        services.probe_result_submit(
            probe=first.probe, credential=first.credential, result=measured(first.node)
        )
    assert refused.value.code == "probe_closed"


# --------------------------------------------------------------------------- transitions


def drive_to(enrolled, state):
    """Bring a freshly enrolled (registered) node to `state` through services."""
    node = enrolled.node
    if state == S.REGISTERED:
        return node
    if state == S.RETIRED:
        return services.node_retire(node=node, actor=SYSTEM)
    if state == S.QUARANTINED:
        return services.node_quarantine(node=node, actor=SYSTEM, message="test")
    node = services.node_verify(node=node, actor=SYSTEM)
    if state == S.VERIFIED:
        return node
    node = services.node_mark_ready(node=node, actor=SYSTEM)
    if state == S.DRAINING:
        node = services.node_drain(node=node, actor=SYSTEM)
    return node


ALL_PAIRS = [(a, b) for a in S.values for b in S.values]


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_every_transition_allowed_or_refused_with_event(enroll, private_pool, source, target):
    node = drive_to(enroll(private_pool), source)
    before = NodeEvent.objects.filter(node=node).count()
    if target in NODE_TRANSITIONS[source]:
        node = services.node_transition(
            node=node, to=target, actor=SYSTEM, reason=Reason.OPERATOR_ACTION, message="t"
        )
        assert node.state == target
        event = last_event(node)
        assert (event.from_state, event.to_state, event.reason) == (
            source,
            target,
            Reason.OPERATOR_ACTION,
        )
        assert event.actor_label == "system:tests"
        assert NodeEvent.objects.filter(node=node).count() == before + 1
    else:
        with pytest.raises(TransitionRefused):
            services.node_transition(
                node=node, to=target, actor=SYSTEM, reason=Reason.OPERATOR_ACTION
            )
        node.refresh_from_db()
        assert node.state == source
        assert NodeEvent.objects.filter(node=node).count() == before


def test_operator_actions_and_their_refusals(ready_node, operator, now):
    actor = Actor.for_user(operator)
    node = ready_node.node
    with pytest.raises(TransitionRefused, match="future"):
        services.node_drain(node=node, actor=actor, deadline=now - timedelta(seconds=1))
    with pytest.raises(TransitionRefused):  # ready → ready is not a transition
        services.node_drain_cancel(node=node, actor=actor)
    with pytest.raises(TransitionRefused):
        services.node_release(node=node, actor=actor)

    node = services.node_drain(node=node, actor=actor, deadline=now + timedelta(hours=1))
    assert node.drain_deadline == now + timedelta(hours=1)
    assert last_event(node).reason == Reason.DRAIN_REQUESTED
    assert last_event(node).actor_label == "user:olga"
    node = services.node_drain_cancel(node=node, actor=actor)
    assert (node.state, node.drain_deadline) == (S.READY, None)
    assert last_event(node).reason == Reason.DRAIN_CANCELLED

    node = services.node_quarantine(node=node, actor=actor, message="flaky NIC")
    assert last_event(node).message == "flaky NIC"
    node = services.node_release(node=node, actor=actor)
    assert node.state == S.READY
    assert last_event(node).reason == Reason.QUARANTINE_RELEASED

    node = services.node_retire(node=node, actor=actor)
    assert node.state == S.RETIRED
    assert not NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()
    for step in (services.node_quarantine, services.node_release, services.node_drain):
        with pytest.raises(TransitionRefused):
            step(node=node, actor=actor, message="x")


# --------------------------------------------------------------------------- credentials


def test_credential_rotation_overlap(ready_node, now):
    old = ready_node.credential
    new, secret = services.node_credential_rotate(
        credential=old, actor=Actor.for_node(ready_node.node), now=now
    )
    assert secret.startswith("cpn_") and new.digest == token_digest(secret)
    old.refresh_from_db()
    assert old.replaced_by == new
    assert old.valid_until == now + timedelta(minutes=10)
    # both valid inside the overlap, only the new one after it
    assert services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=9))[0]
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=9))[0]
    assert services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=10)) == (
        None,
        "credential rotated",
    )
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=11))[0] == new
    assert last_event(ready_node.node).reason == Reason.CREDENTIAL_ROTATED
    # an old credential cannot mint another one
    with pytest.raises(TransitionRefused) as refused:
        services.node_credential_rotate(credential=old, actor=SYSTEM, now=now)
    assert refused.value.code == "credential_already_rotated"


def test_credential_expiry_and_revocation(ready_node, operator, now):
    credential = ready_node.credential
    later = credential.expires_at
    assert services.credential_for_secret(ready_node.secret, now=later) == (
        None,
        "credential expired",
    )
    with pytest.raises(TransitionRefused):
        services.node_credential_rotate(credential=credential, actor=SYSTEM, now=later)
    count = services.node_credentials_revoke(node=ready_node.node, actor=Actor.for_user(operator))
    assert count == 1
    assert services.credential_for_secret(ready_node.secret) == (None, "credential revoked")
    assert last_event(ready_node.node).reason == Reason.CREDENTIAL_REVOKED


def test_operator_reissue_keeps_old_credential_for_the_overlap(ready_node, operator, now):
    new, secret = services.node_credential_reissue(
        node=ready_node.node, actor=Actor.for_user(operator), now=now
    )
    assert services.credential_for_secret(ready_node.secret, now=now)[0]
    assert (
        services.credential_for_secret(ready_node.secret, now=now + timedelta(minutes=10))[0]
        is None
    )
    assert services.credential_for_secret(secret, now=now + timedelta(minutes=10))[0] == new


def test_retired_node_credential_is_refused(ready_node):
    services.node_retire(node=ready_node.node, actor=SYSTEM)
    assert services.credential_for_secret(ready_node.secret)[0] is None


# --------------------------------------------------------------------------- heartbeats


def test_missed_heartbeats_mark_unreachable_and_leases_uncertain(ready_node, make_job, now):
    node = ready_node.node
    _job, lease = make_job(node)
    interval = node.pool.heartbeat_interval_s
    assert (
        services.node_heartbeat_sweep(now=node.last_heartbeat_at + timedelta(seconds=interval))
        == []
    )
    later = node.last_heartbeat_at + timedelta(seconds=3 * interval + 1)
    assert services.node_heartbeat_sweep(now=later) == [node.pk]
    node.refresh_from_db()
    assert (node.state, node.reachability) == (S.READY, Reachability.UNREACHABLE)
    event = last_event(node)
    assert (event.reason, event.from_state, event.to_state) == (
        Reason.NODE_UNREACHABLE,
        S.READY,
        S.READY,
    )
    assert event.data["leases"] == [lease.pk]
    lease.refresh_from_db()
    assert lease.state == LeaseState.UNCERTAIN
    assert lease.events.last().reason == Reason.NODE_SILENT
    # a second sweep finds nothing to do
    assert services.node_heartbeat_sweep(now=later + timedelta(seconds=1)) == []


def test_return_reconciles_reported_and_vanished_workloads(ready_node, make_job, now):
    node = ready_node.node
    _, kept = make_job(node)
    _, gone = make_job(node)
    later = node.last_heartbeat_at + timedelta(seconds=100)
    services.node_heartbeat_sweep(now=later)
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 2000
    node = services.node_heartbeat(
        node=node,
        actor=Actor.for_node(node),
        workloads=[{"lease": kept.pk, "job": kept.job_id}],
        now=later + timedelta(seconds=5),
    )
    assert node.reachability == Reachability.REACHABLE
    assert Reason.NODE_RETURNED in reasons(node)
    kept.refresh_from_db()
    gone.refresh_from_db()
    assert kept.state == LeaseState.COMMITTED
    assert kept.events.last().reason == Reason.RECONCILED_RUNNING
    assert gone.state == LeaseState.RELEASED
    assert gone.events.last().reason == Reason.RECONCILED_GONE
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 1000  # the vanished workload's capacity came back


def test_heartbeat_refuses_leases_and_jobs_of_other_nodes(
    ready_node, enroll, private_pool, make_job
):
    other = enroll(private_pool).node
    job, lease = make_job(other)
    node = ready_node.node
    with pytest.raises(services.NodeScopeRefused):
        services.node_heartbeat(
            node=node, actor=Actor.for_node(node), workloads=[{"lease": lease.pk}]
        )
    with pytest.raises(services.NodeScopeRefused):
        services.node_heartbeat(node=node, actor=Actor.for_node(node), workloads=[{"job": job.pk}])


def test_heartbeat_updates_usage_and_agent_version(ready_node, now):
    node = services.node_heartbeat(
        node=ready_node.node,
        actor=Actor.for_node(ready_node.node),
        usage={"cpu_millicores": 1200},
        agent_version="0.2.0",
        now=now,
    )
    assert node.usage == {"cpu_millicores": 1200}
    assert (node.agent_version, node.last_heartbeat_at) == ("0.2.0", now)


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize(
    ("report", "health", "flag"),
    [
        ({"xid_errors": 2}, GpuHealth.ERROR, "xid_error"),
        ({"ecc_errors_uncorrected": 1}, GpuHealth.ERROR, "xid_error"),
        ({"temperature_c": 93}, GpuHealth.TOO_HOT, "over_temperature"),
        (
            {"temperature_c": 85, "slowdown_temperature_c": 84},
            GpuHealth.TOO_HOT,
            "over_temperature",
        ),
        (
            {"pcie_link_width": 8, "pcie_link_width_max": 16},
            GpuHealth.DEGRADED_LINK,
            "pcie_degraded",
        ),
        ({"nvlink_down": 2}, GpuHealth.DEGRADED_LINK, "pcie_degraded"),
        ({"health_check": "failed"}, GpuHealth.HEALTH_CHECK_FAILED, "health_check_failed"),
    ],
)
def test_unsuitable_device_is_unschedulable_alone(ready_node, report, health, flag):
    node = ready_node.node
    bad, good = node.gpus.order_by("index")
    services.node_heartbeat(
        node=node, actor=Actor.for_node(node), gpus=[{"uuid": bad.uuid, **report}]
    )
    bad.refresh_from_db()
    good.refresh_from_db()
    node.refresh_from_db()
    assert (bad.healthy, bad.health) == (False, health)
    assert flag in bad.health_flags
    assert good.healthy and node.state == S.READY
    assert reasons(node)[-2:] == [Reason.GPU_UNSUITABLE, Reason.PROBE_REQUESTED]
    assert node.probes.get(kind="recovery").gpu == bad


def test_healthy_report_does_not_recover_but_a_passing_probe_does(ready_node):
    node = ready_node.node
    gpu = node.gpus.get(index=0)
    actor = Actor.for_node(node)
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 95}])
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 60}])
    gpu.refresh_from_db()
    assert not gpu.healthy
    probe = node.probes.get(kind="recovery")
    failed = services.probe_result_submit(
        probe=probe,
        credential=ready_node.credential,
        result={"passed": True, "temperature_c": 96},
    )
    assert failed.state == ProbeState.FAILED
    assert last_event(node).reason == Reason.PROBE_FAILED
    gpu.refresh_from_db()
    assert not gpu.healthy
    # the still-open problem is reported again → a new recovery probe
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 97}])
    GpuDevice.objects.filter(pk=gpu.pk).update(healthy=True)  # let the next report re-mark it
    services.node_heartbeat(node=node, actor=actor, gpus=[{"uuid": gpu.uuid, "temperature_c": 97}])
    probe = node.probes.get(kind="recovery", state=ProbeState.REQUESTED)
    passed = services.probe_result_submit(
        probe=probe,
        credential=ready_node.credential,
        result={"passed": True, "temperature_c": 55, "health_check": "passed"},
    )
    assert passed.state == ProbeState.PASSED
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health, gpu.health_flags) == (True, GpuHealth.OK, [])
    event = last_event(node)
    assert event.reason == Reason.GPU_RECOVERED and event.data["gpu"] == gpu.uuid


# --------------------------------------------------------------------------- inventory


def report(node, **changes):
    inv = inventory(
        gpus=0, cpu=node.inventory["cpu_millicores"], memory=node.inventory["memory_mib"]
    )
    inv["gpus"] = [dict(g) for g in node.inventory["gpus"]]
    inv.update(changes)
    return inv


def test_small_drift_adjusts_capacity_with_an_event(ready_node, now):
    node = ready_node.node
    services.node_inventory_report(node=node, inventory=report(node, memory_mib=500000), now=now)
    diffs = services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now)
    assert diffs == [{"field": "memory_mib", "from": 512000, "to": 500000, "percent": -2.3}]
    node.refresh_from_db()
    assert node.state == S.READY
    assert node.memory_mib_raw == 500000
    assert node.memory_mib_allocatable == int((500000 - 1024) * 0.95)
    event = last_event(node)
    assert event.reason == Reason.INVENTORY_DRIFT and "memory_mib: 512000 → 500000" in event.message
    # reconciling the same report again finds nothing
    assert services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now) == []


def test_gpu_gone_is_large_drift_and_quarantines(ready_node, now):
    node = ready_node.node
    gone = node.gpus.get(index=1)
    inv = report(node)
    inv["gpus"] = inv["gpus"][:1]
    services.node_inventory_report(node=node, inventory=inv, now=now)
    results = services.inventory_reconcile_sweep(now=now)
    assert list(results) == [node.pk]
    node.refresh_from_db()
    gone.refresh_from_db()
    assert node.state == S.QUARANTINED
    assert (gone.healthy, gone.health) == (False, GpuHealth.MISSING)
    event = last_event(node)
    assert event.reason == Reason.INVENTORY_DRIFT and event.to_state == S.QUARANTINED
    assert "gone" in event.message and event.data["large"] is True
    assert services.inventory_reconcile_sweep(now=now) == {}


def test_any_drift_in_a_marketplace_pool_quarantines(enroll, market_pool):
    enrolled = enroll(market_pool)
    services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(enrolled.node)
    )
    node = Node.objects.get(pk=enrolled.node.pk)
    inv = report(node)
    inv["gpus"][0]["driver_version"] = "535.0"
    services.node_inventory_report(node=node, inventory=inv)
    services.node_inventory_reconcile(node=node, actor=SYSTEM)
    node.refresh_from_db()
    assert node.state == S.QUARANTINED
    assert "untrusted" in last_event(node).message


def test_drift_never_drops_allocatable_below_what_leases_hold(ready_node, make_job, now):
    node = ready_node.node
    make_job(node, cpu=20000)
    services.node_inventory_report(node=node, inventory=report(node, cpu_millicores=8000), now=now)
    services.node_inventory_reconcile(node=node, actor=SYSTEM, now=now)
    node.refresh_from_db()
    assert node.cpu_millicores_allocatable == 20000 == node.cpu_millicores_reserved
    assert node.state == S.QUARANTINED  # −87 % is large
    drift = NodeEvent.objects.filter(node=node, reason=Reason.INVENTORY_DRIFT).first()
    assert drift.data["capped_by_reserved"] == ["cpu_millicores"]


# --------------------------------------------------------------------------- drain


def test_drain_deadline_checkpoints_requeues_and_fails_per_policy(ready_node, make_job, now):
    node = ready_node.node
    ckpt, _ = make_job(node, checkpointable=True)
    plain, plain_lease = make_job(node)
    early, early_lease = make_job(node, state=JobState.LEASED)
    node = services.node_drain(
        node=node, actor=SYSTEM, deadline=now + timedelta(minutes=5), now=now
    )
    assert services.node_drain_sweep(now=now + timedelta(minutes=4)) == {
        "enforced": [],
        "completed": [],
    }
    result = services.node_drain_sweep(now=now + timedelta(minutes=5))
    assert result["enforced"] == [node.pk]
    for job in (ckpt, plain, early):
        job.refresh_from_db()
    assert ckpt.state == JobState.CHECKPOINTING
    assert plain.state == JobState.FAILED
    assert early.state == JobState.QUEUED
    for job in (ckpt, plain, early):
        assert job.events.last().reason == Reason.DRAIN_DEADLINE
    plain_lease.refresh_from_db()
    early_lease.refresh_from_db()
    assert plain_lease.state == early_lease.state == LeaseState.RELEASED
    event = NodeEvent.objects.filter(node=node, reason=Reason.DRAIN_DEADLINE).get()
    assert event.data["checkpointing"] == [ckpt.pk] and event.data["policy"] == "fail"
    # enforced once only
    services.node_drain_sweep(now=now + timedelta(minutes=6))
    assert NodeEvent.objects.filter(node=node, reason=Reason.DRAIN_DEADLINE).count() == 1
    # the agent reports the checkpoint: re-queued, lease released, drain complete
    ckpt = services.agent_job_checkpointed(
        node=node, job=ckpt, actor=Actor.for_node(node), now=now + timedelta(minutes=6)
    )
    assert ckpt.state == JobState.QUEUED
    assert ckpt.events.last().reason == Reason.CHECKPOINT_DONE
    result = services.node_drain_sweep(now=now + timedelta(minutes=7))
    assert result["completed"] == [node.pk]
    node.refresh_from_db()
    assert node.cpu_millicores_reserved == 0 and node.drained_at is not None
    assert last_event(node).reason == Reason.DRAIN_COMPLETED


def test_drain_policy_wait_leaves_non_checkpointable_work_running(ready_node, make_job, now):
    node = ready_node.node
    policy_version_publish(
        policy=node.pool.scheduling_policy,
        weights={"bin_pack": 1.0},
        knobs={"drain_noncheckpointable": "wait"},
        comment="let it run",
        actor=SYSTEM,
    )
    job, _ = make_job(node)
    services.node_drain(node=node, actor=SYSTEM, deadline=now + timedelta(minutes=1), now=now)
    outcome = services.node_drain_enforce(node=node, actor=SYSTEM, now=now + timedelta(minutes=1))
    assert outcome["left_running"] == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert services.node_drain_complete(node=node, actor=SYSTEM) is False


def test_agent_cannot_checkpoint_a_job_placed_elsewhere(ready_node, enroll, private_pool, make_job):
    other = enroll(private_pool).node
    job, _ = make_job(other, checkpointable=True)
    with pytest.raises(services.NodeScopeRefused):
        services.agent_job_checkpointed(
            node=ready_node.node, job=job, actor=Actor.for_node(ready_node.node)
        )
