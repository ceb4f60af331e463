"""Persistent volumes through the API and the services (issue 23, docs/storage.md "Persistent
volumes"): where a volume lives, what it holds of its node's disk and its tenant's quota, who
sees it, its lifecycle events, what a job may mount, and how the pass tells a volume-bound
wait. The real agent and Docker: test_volumes_e2e.py; races: test_volumes_race.py."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_person, build_pool, build_tenant, submit_job
from jobs.choices import JobState
from jobs.models import JobOutput
from jobs.services import job_transition
from leases.selectors import ledger_problems
from leases.services.quota import stored_bytes
from nodes import services as node_services
from nodes.models import Node
from pools.models import Quota, TenantBucket
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from storage import services
from storage.models import Volume
from tests.clients import client_for

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024


@pytest.fixture
def pool():
    return build_pool("vol", exact_capacity=True)


@pytest.fixture
def tenant():
    return build_tenant("vol-a", name="Vol A")


@pytest.fixture
def alice(tenant):
    return build_person("vol-alice", tenant=tenant)


def create(client, **body):
    body = {"tenant": "vol-a", "pool": "vol", "name": "data", "size_mib": 100} | body
    return client.post("/api/v1/volumes", body, format="json")


def reasons(volume) -> list[str]:
    return list(volume.events.order_by("id").values_list("reason", flat=True))


def test_a_volume_lives_on_the_node_with_most_free_disk_and_holds_its_size_there(
    pool, tenant, alice
):
    build_node(pool, "small", scratch=2000)
    big = build_node(pool, "big", scratch=5000)
    response = create(client_for(alice), size_mib=1500)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["node"] == "big" and body["state"] == "available" and body["size_mib"] == 1500
    assert body["at_risk"] is False and body["retention_days"] == 30
    big.refresh_from_db()
    assert big.scratch_mib_reserved == 1500
    assert ledger_problems(pool) == []
    assert stored_bytes(pool.pk, [tenant.pk])[tenant.pk] == 1500 * MIB
    # named node and zone affinity
    assert create(client_for(alice), name="pinned", node="small").json()["node"] == "small"
    refused = create(client_for(alice), name="nowhere", node="ghost")
    assert refused.status_code == 400 and "node" in refused.json()


def test_a_volume_larger_than_any_node_disk_free_is_refused_and_takes_nothing(pool, tenant, alice):
    node = build_node(pool, "n1", scratch=1000)
    response = create(client_for(alice), size_mib=1001)
    assert response.status_code == 409 and response.json()["code"] == "volume_node_full"
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 0 and not Volume.objects.exists()


def test_the_storage_quota_counts_volumes(pool, tenant, alice):
    build_node(pool, "n1", scratch=10_000)
    Quota.objects.create(
        tenant=tenant, pool=pool, cpu_millicores=4000, memory_mib=8192, storage_mib=300
    )
    assert create(client_for(alice), size_mib=200).status_code == 201
    refused = create(client_for(alice), name="more", size_mib=101)
    assert refused.status_code == 409
    assert refused.json()["code"] == "quota_exceeded"
    assert refused.json()["dimension"] == "storage_mib"
    assert create(client_for(alice), name="more", size_mib=100).status_code == 201


def test_outputs_in_the_tenants_own_bucket_count_against_no_quota_here(pool, tenant, alice):
    """The storage quota counts what the control plane keeps: an output that lives in the
    tenant's bucket (`location`) takes none of it, and a job bound for that bucket may ask for
    more /outputs than the quota has left (a job bound for the control plane may not)."""
    build_node(pool, "n1", scratch=10_000)
    Quota.objects.create(
        tenant=tenant, pool=pool, cpu_millicores=4000, memory_mib=8192, storage_mib=300
    )
    bucket = TenantBucket(tenant=tenant, bucket="vol-data", endpoint="http://127.0.0.1:9000")
    bucket.seal("AKIAVOL", "vol-secret")
    bucket.save()
    job = submit_job(pool, tenant, output_destination="s3://vol-data/out/", output_limit_mib=500)
    assert job.output_limit_mib == 500
    JobOutput.objects.create(
        job=job, attempt=1, name="big.bin", size=250 * MIB, sha256="0" * 64,
        location="s3://vol-data/out/1/1/big.bin",
    )  # fmt: skip
    assert stored_bytes(pool.pk, [tenant.pk])[tenant.pk] == 0
    assert create(client_for(alice), size_mib=300).status_code == 201  # the whole quota
    with pytest.raises(ValidationError) as refused:
        submit_job(pool, tenant, output_limit_mib=1)
    assert "output_limit_mib" in str(refused.value)


def test_a_volume_no_job_ever_mounted_gives_its_disk_back_when_deleted(pool, tenant, alice):
    """No job started with it, so its node never made its image: nothing to wait for."""
    node = build_node(pool, "n1", scratch=1000)
    volume = create(client_for(alice), size_mib=600).json()
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 600
    assert client_for(alice).delete(f"/api/v1/volumes/{volume['id']}").status_code == 200
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 0 and ledger_problems(pool) == []
    assert reasons(Volume.objects.get(pk=volume["id"]))[-1] == "volume_disk_released"


def test_names_are_unique_among_live_volumes_and_bad_input_is_a_400(pool, tenant, alice):
    build_node(pool, "n1")
    client = client_for(alice)
    first = create(client).json()
    assert create(client).json()["code"] == "volume_name_taken"
    assert client.delete(f"/api/v1/volumes/{first['id']}").json()["state"] == "deleted"
    assert create(client).status_code == 201  # the name is free once the first one is gone
    for body in ({"size_mib": 0}, {"size_mib": "big"}, {"name": "Bad Name"}, {"extra": 1}):
        response = create(client, **body)
        assert response.status_code == 400, body
    assert create(client, tenant="nope").status_code == 400


def test_other_tenants_never_see_a_volume(pool, tenant, alice):
    build_node(pool, "n1")
    volume = create(client_for(alice)).json()
    other = build_person("vol-bob", tenant=build_tenant("vol-b"))
    assert client_for(other).get(f"/api/v1/volumes/{volume['id']}").status_code == 404
    assert client_for(other).delete(f"/api/v1/volumes/{volume['id']}").status_code == 404
    assert client_for(other).get("/api/v1/volumes").json()["count"] == 0
    assert client_for(alice).get("/api/v1/volumes").json()["count"] == 1
    assert client_for(None).get("/api/v1/volumes").status_code in (401, 403)


def test_lifecycle_attach_detach_delete_each_an_event_and_the_disk_returns_when_the_node_says(
    pool, tenant, alice
):
    node = build_node(pool, "n1", scratch=1000)
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=400, actor=SYSTEM)
    services.volume_attach(volume_id=volume.pk, job_id=11, read_only=False, actor=SYSTEM)
    services.volume_attach(volume_id=volume.pk, job_id=12, read_only=True, actor=SYSTEM)
    with pytest.raises(services.TransitionRefused) as refused:
        services.volume_attach(volume_id=volume.pk, job_id=13, read_only=False, actor=SYSTEM)
    assert refused.value.code == Reason.VOLUME_IN_USE
    response = client_for(alice).delete(f"/api/v1/volumes/{volume.pk}")
    assert response.status_code == 409 and response.json()["code"] == "volume_in_use"
    services.volumes_detach(job_id=11, actor=SYSTEM)
    volume.refresh_from_db()
    assert volume.state == "attached" and volume.holder_job_id is None  # 12 still reads
    services.volumes_detach(job_id=12, actor=SYSTEM)
    volume.refresh_from_db()
    assert volume.state == "available" and volume.expires_at is not None
    assert client_for(alice).delete(f"/api/v1/volumes/{volume.pk}").status_code == 200
    assert stored_bytes(pool.pk, [tenant.pk])[tenant.pk] == 0  # the quota at once
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 400  # the image is still on the node's disk
    # the node reports it still holds the image: told to remove it
    answer = services.volumes_reconcile(node=node, reported=[{"id": volume.pk, "used_bytes": 9}])
    assert answer == {"remove": [volume.pk]}
    services.volumes_reconcile(node=node, reported=[])  # gone: the disk is back
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 0 and ledger_problems(pool) == []
    volume.refresh_from_db()
    assert reasons(volume) == [
        "volume_created",
        "volume_attached",
        "volume_attached",
        "volume_detached",
        "volume_detached",
        "volume_deleted",
        "volume_disk_released",
    ]


def test_retention_expires_what_expired_and_nothing_else(pool, tenant):
    build_node(pool, "n1")
    now = timezone.now()
    old = services.volume_create(
        tenant=tenant, pool=pool, name="old", size_mib=10, actor=SYSTEM, retention_days=1,
        now=now - timedelta(days=2),
    )  # fmt: skip
    fresh = services.volume_create(
        tenant=tenant, pool=pool, name="fresh", size_mib=10, actor=SYSTEM, retention_days=3,
        now=now - timedelta(days=2),
    )  # fmt: skip
    busy = services.volume_create(
        tenant=tenant, pool=pool, name="busy", size_mib=10, actor=SYSTEM, retention_days=1,
        now=now - timedelta(days=2),
    )  # fmt: skip
    services.volume_attach(volume_id=busy.pk, job_id=5, read_only=False, actor=SYSTEM)
    assert services.expire_volumes(now=now) == 1
    states = dict(Volume.objects.values_list("name", "state"))
    assert states == {"old": "expired", "fresh": "available", "busy": "attached"}
    # never mounted, so no image: its disk is back with the expiry
    assert reasons(Volume.objects.get(pk=old.pk))[-2:] == ["volume_expired", "volume_disk_released"]
    assert fresh.pk and stored_bytes(pool.pk, [tenant.pk])[tenant.pk] == 20 * MIB


def test_a_volume_on_a_draining_node_is_at_risk(pool, tenant, alice):
    node = build_node(pool, "n1")
    volume = create(client_for(alice)).json()
    node_services.node_drain(node=node, actor=SYSTEM)
    body = client_for(alice).get(f"/api/v1/volumes/{volume['id']}").json()
    assert body["at_risk"] is True and body["at_risk_reason"] == "node_draining"
    assert body["node_state"] == "draining"


def submit_with(pool, tenant, volume, name="uses", read_only=False, cpu=1000):
    mounts = [{"volume": volume.pk, "path": "/data", "read_only": read_only}]
    return submit_job(pool, tenant, name, cpu=cpu, volumes=mounts)


def test_a_job_is_placed_where_its_volume_is(pool, tenant):
    build_node(pool, "roomy", cpu=8000, scratch=90_000)
    build_node(pool, "home", cpu=2000, scratch=50_000)
    volume = services.volume_create(
        tenant=tenant, pool=pool, name="d", size_mib=100, actor=SYSTEM, node_name="home"
    )
    jobs = [submit_with(pool, tenant, volume, f"r{i}", read_only=True) for i in range(2)]
    scheduling_pass()
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.LEASED and job.leases.get().node.name == "home"


def test_a_job_whose_volume_node_is_full_waits_with_volume_node_full(pool, tenant):
    build_node(pool, "home", cpu=1000, scratch=50_000)
    build_node(pool, "other", cpu=8000, scratch=50_000)
    volume = services.volume_create(
        tenant=tenant, pool=pool, name="d", size_mib=100, actor=SYSTEM, node_name="home"
    )
    job = submit_with(pool, tenant, volume, cpu=1000)
    assert job.resources["node_pin"] == "home"
    # another volume takes the rest of home's disk: the job's /outputs (1024 MiB) has no room
    services.volume_create(
        tenant=tenant, pool=pool, name="big", size_mib=49_500, actor=SYSTEM, node_name="home"
    )
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.pending_reason["code"] == "volume_node_full"
    assert job.pending_reason["node"] == "home"


def test_a_job_whose_volume_node_drains_waits_with_volume_node_unavailable(pool, tenant):
    home = build_node(pool, "home")
    build_node(pool, "other")
    volume = services.volume_create(
        tenant=tenant, pool=pool, name="d", size_mib=100, actor=SYSTEM, node_name="home"
    )
    node_services.node_drain(node=home, actor=SYSTEM)
    job = submit_with(pool, tenant, volume)
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.pending_reason["code"] == "volume_node_unavailable"
    assert job.pending_reason["node_state"] == "draining"


def test_a_second_read_write_job_waits_while_the_first_holds_the_volume(pool, tenant):
    build_node(pool, "home", cpu=8000)
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=100, actor=SYSTEM)
    writer = submit_with(pool, tenant, volume, "writer")
    scheduling_pass()
    second = submit_with(pool, tenant, volume, "second")
    reader = submit_with(pool, tenant, volume, "reader", read_only=True)
    scheduling_pass()
    writer.refresh_from_db(), second.refresh_from_db(), reader.refresh_from_db()
    assert writer.state == JobState.LEASED and reader.state == JobState.LEASED
    assert second.state == JobState.QUEUED
    assert second.pending_reason["code"] == "volume_in_use"
    # the writer starts (attached), ends (detached): the second one is placed
    job_transition(job=writer, to=JobState.STARTING, actor=SYSTEM, reason=Reason.STARTUP_BEGAN)
    volume.refresh_from_db()
    assert volume.state == "attached" and volume.holder_job_id == writer.pk
    job_transition(job=writer, to=JobState.CANCELLED, actor=SYSTEM, reason=Reason.CANCELLED_BY_USER)
    volume.refresh_from_db()
    assert volume.holder_job_id is None
    Node.objects.update()  # nothing else changed
    scheduling_pass()
    second.refresh_from_db()
    assert second.state == JobState.LEASED


@pytest.mark.parametrize(
    "mounts",
    [
        [{"volume": 1, "path": "/outputs"}],
        [{"volume": 1, "path": "/outputs/x"}],
        [{"volume": 1, "path": "/"}],
        [{"volume": 1, "path": "/etc/data"}],
        [{"volume": 1, "path": "data"}],
        [{"volume": 1, "path": "/a/../b"}],
        [{"volume": 1, "path": "/run"}],
        [{"volume": 1, "path": "/data", "read_only": "yes"}],
        [{"volume": 1, "path": "/a"}, {"volume": 2, "path": "/a/b"}],
        [{"volume": i, "path": f"/d{i}"} for i in range(1, 10)],
        "nope",
    ],
)
def test_bad_mounts_are_a_400_on_volumes(pool, tenant, alice, mounts):
    build_node(pool, "n1")
    body = {
        "tenant": "vol-a",
        "pool": "vol",
        "name": "j",
        "image": "127.0.0.1:5000/computepool/busybox:test",
        "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
        "volumes": mounts,
    }
    response = client_for(alice).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400 and "volumes" in response.json(), response.content


def test_a_job_may_not_mount_another_tenants_or_a_deleted_volume(pool, tenant, alice):
    build_node(pool, "n1")
    theirs = services.volume_create(
        tenant=build_tenant("vol-b"), pool=pool, name="d", size_mib=10, actor=SYSTEM
    )
    gone = services.volume_create(tenant=tenant, pool=pool, name="g", size_mib=10, actor=SYSTEM)
    services.volume_delete(volume=gone, actor=SYSTEM)
    for volume in (theirs, gone):
        body = {
            "tenant": "vol-a",
            "pool": "vol",
            "name": "j",
            "image": "127.0.0.1:5000/computepool/busybox:test",
            "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
            "volumes": [{"volume": volume.pk, "path": "/data"}],
        }
        response = client_for(alice).post("/api/v1/jobs", body, format="json")
        assert response.status_code == 400 and "volumes" in response.json()
