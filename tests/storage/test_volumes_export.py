"""POST /api/v1/volumes/{id}/export (docs/storage.md "Persistent volumes"): a job of the
tenant on the volume's node that mounts it read-only and tars it to a bucket the tenant
registered; who may ask; what the node's state allows. The whole path with the real agent and
the local S3 server: test_volumes_export_e2e.py."""

import pytest

from config.builders import SYSTEM, build_node, build_person, build_pool, build_tenant
from jobs.choices import JobState
from jobs.models import Job
from nodes import services as node_services
from nodes.models import Node
from pools.choices import PlatformRole, TenantRole
from scheduling.passes import scheduling_pass
from storage import services
from tests.clients import client_for
from tests.storage.s3server import (
    register_bucket,
    s3,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("s3")]


@pytest.fixture
def pool():
    return build_pool("vexp", exact_capacity=True)


@pytest.fixture
def tenant():
    return build_tenant("vexp-a")


@pytest.fixture
def alice(tenant):
    return build_person("vexp-alice", tenant=tenant)


@pytest.fixture
def bucket(tenant):
    return register_bucket(tenant, "vexp")


def export(user, volume, destination):
    return client_for(user).post(
        f"/api/v1/volumes/{volume.pk}/export", {"destination": destination}, format="json"
    )


@pytest.fixture
def volume(pool, tenant):
    build_node(pool, "other", scratch=200_000)
    build_node(pool, "home", scratch=50_000)
    return services.volume_create(
        tenant=tenant, pool=pool, name="data", size_mib=300, actor=SYSTEM, node_name="home"
    )


def test_an_export_is_a_job_of_the_tenant_on_the_volumes_node_mounting_it_read_only(
    pool, alice, volume, bucket
):
    response = export(alice, volume, f"s3://{bucket}/backups")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["volume"] == volume.pk and body["archive"] == "volume.tar"
    assert body["destination"] == f"s3://{bucket}/backups/"
    job = Job.objects.get(pk=body["job"])
    assert job.tenant_id == volume.tenant_id and job.state == JobState.QUEUED
    assert job.volumes == [{"volume": volume.pk, "path": "/mnt/volume", "read_only": True}]
    assert job.command == ["sh", "-c", "tar -cf /outputs/volume.tar -C /mnt/volume ."]
    assert job.output_destination == f"s3://{bucket}/backups/"
    assert job.output_limit_mib >= volume.size_mib  # the whole volume fits its /outputs
    assert job.resources["node_pin"] == "home" and "volume_writes" not in job.resources
    events = client_for(alice).get(f"/api/v1/volumes/{volume.pk}/events").json()
    assert events[-1]["reason"] == "volume_export_requested"
    assert events[-1]["data"] == {"job": job.pk, "destination": f"s3://{bucket}/backups/"}
    scheduling_pass()
    job.refresh_from_db()
    assert job.state == JobState.LEASED and job.leases.get().node.name == "home"
    # while the export waits, the volume is in use: its delete is refused, naming the job
    refused = client_for(alice).delete(f"/api/v1/volumes/{volume.pk}")
    assert refused.status_code == 409 and refused.json()["jobs"] == [job.pk]


def test_a_bad_or_unregistered_destination_is_a_400_on_destination(alice, volume, bucket):
    for destination in ("", "/tmp/x", "https://example.com/b", "s3://not-ours-bucket/p/", 7):
        response = export(alice, volume, destination)
        assert response.status_code == 400, (destination, response.content)
        assert "destination" in response.json(), response.content
    response = client_for(alice).post(f"/api/v1/volumes/{volume.pk}/export", {}, format="json")
    assert response.status_code == 400 and "destination" in response.json()
    assert not Job.objects.exists()


def test_who_may_export(pool, tenant, alice, volume, bucket):
    stranger = build_person("vexp-bob", tenant=build_tenant("vexp-b"))
    assert export(stranger, volume, f"s3://{bucket}/p/").status_code == 404
    operator = build_person("vexp-op", platform_role=PlatformRole.OPERATOR)
    assert export(operator, volume, f"s3://{bucket}/p/").status_code == 403
    assert client_for(None).post(f"/api/v1/volumes/{volume.pk}/export").status_code in (401, 403)
    reader = client_for(alice, scopes=["read"]).post(
        f"/api/v1/volumes/{volume.pk}/export", {"destination": f"s3://{bucket}/p/"}, format="json"
    )
    assert reader.status_code == 403
    admin = build_person("vexp-admin", tenant=tenant, role=TenantRole.ADMIN)
    assert export(admin, volume, f"s3://{bucket}/p/").status_code == 202
    assert Job.objects.count() == 1


def test_an_at_risk_volume_exports_only_where_its_node_can_run_the_job(alice, volume, bucket):
    home = Node.objects.get(name="home")
    destination = f"s3://{bucket}/p/"
    Node.objects.filter(pk=home.pk).update(reachability="unreachable")
    response = export(alice, volume, destination)
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "volume_node_unavailable" and body["node"] == "home"
    assert "unreachable" in body["node_state"] and "does not answer" in body["detail"]
    Node.objects.filter(pk=home.pk).update(reachability="reachable")
    node_services.node_drain(node=home, actor=SYSTEM)
    Node.objects.filter(pk=home.pk).update(reachability="unreachable")  # draining and lost
    response = export(alice, volume, destination)
    assert response.status_code == 409 and response.json()["node_state"] == "draining, unreachable"
    assert not Job.objects.exists()
    # a draining, reachable node runs the export: test_volumes_export_drain.py
    services.volume_delete(volume=volume, actor=SYSTEM)
    response = export(alice, volume, destination)
    assert response.status_code == 409 and response.json()["code"] == "volume_gone"
