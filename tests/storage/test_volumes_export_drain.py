"""A volume's export while its node is being drained (issue 23; docs/storage.md "Persistent
volumes", docs/nodes.md): the export job alone is drain-exempt — the core's `node_schedulable`
filter, the snapshot and the ledger's guarded UPDATE let it on the draining node, by the batch
pass and by the single path (`lease_reserve`) alike —, a normal job pinned there still waits
with `volume_node_unavailable`, no tenant can ask for the exemption, and at the drain deadline
the export follows the pool's `drain_noncheckpointable` knob. With the real agent and the local
S3 server: test_volumes_export_e2e.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_person, build_pool, build_tenant
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.models import Job
from leases import snapshot
from leases.choices import HOLDING
from leases.models import Lease
from leases.selectors import ledger_problems
from leases.services import ledger
from nodes import services as node_services
from nodes.models import Node
from placement import place
from pools.actors import Actor
from pools.services import policy_version_publish
from scheduling import drain
from scheduling.pass_steps.single import place_one
from scheduling.passes import scheduling_pass
from storage import services
from tests.clients import client_for
from tests.storage.s3server import (
    register_bucket,
    s3,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("s3")]


@pytest.fixture(params=[False, True], ids=["batch", "single"])
def portable(request, settings):
    """The batch pass (PostgreSQL's statements) or the single path through `lease_reserve`
    with the ORM guards (what a SQLite deployment runs: leases/backend.py)."""
    settings.LEASE_PORTABLE_PATHS = request.param
    return request.param


@pytest.fixture
def pool():
    return build_pool("vdrn", exact_capacity=True)


@pytest.fixture
def tenant():
    return build_tenant("vdrn-a")


@pytest.fixture
def alice(tenant):
    return build_person("vdrn-alice", tenant=tenant)


@pytest.fixture
def bucket(tenant):
    return register_bucket(tenant, "vdrn")


@pytest.fixture
def volume(pool, tenant):
    build_node(pool, "other", scratch=200_000)
    build_node(pool, "home", scratch=50_000)
    return services.volume_create(
        tenant=tenant, pool=pool, name="data", size_mib=300, actor=SYSTEM, node_name="home"
    )


def home() -> Node:
    return Node.objects.get(name="home")


def export(user, volume, destination):
    return client_for(user).post(
        f"/api/v1/volumes/{volume.pk}/export", {"destination": destination}, format="json"
    )


def submit(user, tenant, pool, **fields):
    body = {
        "tenant": tenant.slug,
        "pool": pool.slug,
        "name": "reader",
        "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
        "image": "127.0.0.1:5000/computepool/busybox:test",
        "command": ["true"],
    } | fields
    return client_for(user).post("/api/v1/jobs", body, format="json")


def test_an_export_is_placed_on_its_draining_node_and_a_normal_job_pinned_there_is_not(
    portable, pool, tenant, alice, volume, bucket
):
    mount = [{"volume": volume.pk, "path": "/data", "read_only": True}]
    reader = submit(alice, tenant, pool, volumes=mount)
    assert reader.status_code == 201, reader.content
    node_services.node_drain(node=home(), actor=SYSTEM)
    scheduling_pass()
    normal = Job.objects.get(pk=reader.json()["id"])
    assert normal.state == JobState.QUEUED
    waits = normal.pending_reason  # before any export: what it waits with
    response = export(alice, volume, f"s3://{bucket}/backups/")
    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["job"])
    assert job.resources["drain_exempt"] is True and job.resources["node_pin"] == "home"
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.LEASED, job.pending_reason
    lease = job.leases.get()
    assert lease.node.name == "home" and lease.request["drain_exempt"] is True
    normal.refresh_from_db()
    assert normal.state == JobState.QUEUED and not normal.leases.exists()
    # its pending reason as before the export (the batch pass words it as the volume's wait);
    # in this pass the snapshot viewed the draining node, for the export: counted as such
    assert normal.pending_reason["code"] == waits["code"]
    counted = dict(normal.pending_reason.get("reasons") or {})
    if not portable:
        assert counted.pop("node_not_schedulable(draining)") == 1
    assert counted == (waits.get("reasons") or {})
    if not portable:
        assert waits["code"] == "volume_node_unavailable" and waits["node_state"] == "draining"
    assert ledger_problems(pool) == []


@pytest.mark.parametrize("portable_", [False, True], ids=["postgresql", "portable"])
def test_the_single_path_places_an_export_on_its_draining_node_and_not_a_normal_job(
    portable_, settings, pool, tenant, alice, volume, bucket
):
    """`lease_reserve` through the pass's single path (`place_one`: a plan whose apply failed,
    SQLite), on PostgreSQL's statements and on the ORM's."""
    settings.LEASE_PORTABLE_PATHS = portable_
    node_services.node_drain(node=home(), actor=SYSTEM)
    mount = [{"volume": volume.pk, "path": "/data", "read_only": True}]
    reader = submit(alice, tenant, pool, volumes=mount)
    response = export(alice, volume, f"s3://{bucket}/p/")
    assert reader.status_code == 201 and response.status_code == 202
    now = timezone.now()
    assert place_one(reader.json()["id"], now) == "no_capacity"
    assert place_one(response.json()["job"], now) is True
    job = Job.objects.get(pk=response.json()["job"])
    assert job.state == JobState.LEASED and job.leases.get().node.name == "home"
    assert not Job.objects.get(pk=reader.json()["id"]).leases.exists()
    assert ledger_problems(pool) == []


def test_an_export_waiting_for_room_on_its_draining_node_says_volume_node_full(
    pool, alice, volume, bucket
):
    node_services.node_drain(node=home(), actor=SYSTEM)
    Node.objects.filter(name="home").update(scratch_mib_reserved=50_000)  # its disk all taken
    response = export(alice, volume, f"s3://{bucket}/p/")
    assert response.status_code == 202, response.content
    scheduling_pass()
    job = Job.objects.get(pk=response.json()["job"])
    assert job.state == JobState.QUEUED
    assert job.pending_reason["code"] == "volume_node_full", job.pending_reason
    assert job.pending_reason["node_state"] == "draining"


@pytest.mark.parametrize("state", ["quarantined", "retired"])
def test_a_quarantined_or_retired_nodes_volume_is_still_not_exported(state, alice, volume, bucket):
    if state == "quarantined":
        node_services.node_quarantine(node=home(), actor=SYSTEM, message="suspect")
    else:
        node_services.node_retire(node=home(), actor=SYSTEM)
    response = export(alice, volume, f"s3://{bucket}/p/")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "volume_node_unavailable"
    assert response.json()["node_state"] == state
    assert not Job.objects.exists()


def test_a_tenant_cannot_ask_for_the_drain_exemption(pool, tenant, alice, volume):
    mount = [{"volume": volume.pk, "path": "/data", "read_only": True}]
    top = submit(alice, tenant, pool, volumes=mount, drain_exempt=True)
    assert top.status_code == 400 and "drain_exempt" in top.json(), top.content
    inline = submit(
        alice,
        tenant,
        pool,
        volumes=mount,
        resources={"cpu_millicores_min": 100, "memory_mib_min": 64, "drain_exempt": True},
    )
    assert inline.status_code == 400, inline.content
    assert "drain_exempt" in inline.json()["resources"]
    lease = client_for(alice).post(
        "/api/v1/compute-leases",
        {
            "tenant": tenant.slug,
            "pool": pool.slug,
            "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64, "drain_exempt": True},
            "duration_s": 600,
        },
        format="json",
    )
    assert lease.status_code == 400, lease.content
    assert not Job.objects.exists() and not Lease.objects.exists()


def guarded_row(pool, tenant, request: dict) -> ledger.Row:
    """A lease row planned on a snapshot that views the draining node `home` (as the pass's
    does for a drain-exempt request), the core request made drain-exempt to place it there."""
    view = snapshot.pool_snapshot(pool.pk, leases=False, draining=("home",))
    req = snapshot.core_request({**request, "drain_exempt": True, "node_pin": "home"}, tenant.pk)
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
        allocations=[],
    )


@pytest.mark.parametrize("portable_", [False, True], ids=["postgresql", "portable"])
def test_the_ledgers_guard_lets_only_drain_exempt_leases_on_a_draining_node(
    portable_, settings, pool, tenant, volume
):
    settings.LEASE_PORTABLE_PATHS = portable_
    node_services.node_drain(node=home(), actor=SYSTEM)
    base = {"cpu_millicores_min": 100, "memory_mib_min": 64, "node_pin": "home"}
    exempt = {**base, "drain_exempt": True}
    # a normal lease planned there (a stale snapshot) takes nothing: the node is draining
    plain = guarded_row(pool, tenant, base)
    applied = ledger.apply([plain])
    assert applied.taken == [] and applied.conflicts == [(plain, home().pk)]
    # a drain-exempt one beside a normal one on the node: the node's part is not all exempt
    mixed = [guarded_row(pool, tenant, exempt), guarded_row(pool, tenant, base)]
    applied = ledger.apply(mixed)
    assert applied.taken == [] and len(applied.conflicts) == 2
    # drain-exempt ones alone take it
    alone = [guarded_row(pool, tenant, exempt), guarded_row(pool, tenant, exempt)]
    assert ledger.apply(alone).taken == alone
    assert home().cpu_millicores_reserved == 200
    # never on a node quarantined since the snapshot, drain-exempt or not
    late = [guarded_row(pool, tenant, exempt)]
    Node.objects.filter(name="home").update(state="quarantined")
    assert ledger.apply(late).taken == []
    assert ledger_problems(pool) == []


def test_a_pass_without_a_drain_exempt_job_does_not_read_the_draining_node(pool, volume):
    node_services.node_drain(node=home(), actor=SYSTEM)
    plain = snapshot.pool_snapshot(pool.pk)
    assert [n.name for n in plain.nodes] == ["other"]
    pinned = snapshot.core_request({"node_pin": "home", "drain_exempt": True}, 1)
    assert snapshot.draining_pins([pinned, snapshot.core_request({}, 1)]) == {"home"}
    viewed = snapshot.pool_snapshot(pool.pk, draining=snapshot.draining_pins([pinned]))
    assert [(n.name, n.state) for n in viewed.nodes] == [
        ("home", "draining"),
        ("other", "ready"),
    ]
    # a quarantined node is not read even when named
    Node.objects.filter(name="home").update(state="quarantined")
    assert [n.name for n in snapshot.pool_snapshot(pool.pk, draining=("home",)).nodes] == ["other"]


@pytest.mark.parametrize("policy", ["fail", "wait"])
def test_at_the_drain_deadline_an_export_follows_the_knob_and_the_drain_then_completes(
    policy, pool, alice, volume, bucket
):
    if policy == "wait":
        policy_version_publish(
            policy=pool.scheduling_policy,
            weights=dict(pool.scheduling_policy.current.weights),
            knobs={"drain_noncheckpointable": "wait"},
            comment="let it run",
            actor=SYSTEM,
        )
    now = timezone.now()
    node_services.node_drain(
        node=home(), actor=SYSTEM, deadline=now + timedelta(minutes=5), now=now
    )
    response = export(alice, volume, f"s3://{bucket}/p/")
    assert response.status_code == 202, response.content
    scheduling_pass()
    job = Job.objects.get(pk=response.json()["job"])
    assert job.state == JobState.LEASED
    lease = job.leases.get()
    # it holds the drain while it holds its lease
    assert drain.node_drain_sweep(now=now + timedelta(minutes=1))["completed"] == []
    result = drain.node_drain_sweep(now=now + timedelta(minutes=5))
    assert result["enforced"] == [home().pk]
    job.refresh_from_db()
    if policy == "fail":
        # not re-queued (it could only come back here): failed, its lease released
        assert job.state == JobState.FAILED
        assert job.events.last().reason == "drain_deadline"
    else:
        assert job.state == JobState.LEASED  # runs to its end
        assert drain.node_drain_sweep(now=now + timedelta(minutes=6))["completed"] == []
        agent = Actor.for_node(home())
        token = lease.fencing_token
        for step in ("starting", "running"):
            job_report(job=job, node=home(), fencing_token=token, step=step, actor=agent)
        job_report(
            job=job, node=home(), fencing_token=token, step="succeeded", exit_code=0, actor=agent
        )
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED
    assert not Lease.objects.filter(node=home(), state__in=HOLDING).exists()
    drain.node_drain_sweep(now=now + timedelta(minutes=7))  # (fail: done at the deadline's)
    assert home().drained_at is not None
    assert ledger_problems(pool) == []
