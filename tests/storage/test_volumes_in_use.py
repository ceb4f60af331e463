"""A volume that a job which has not ended mounts (queued ones included) is protected
(docs/storage.md "Persistent volumes"): its delete is refused 409 `volume_in_use` naming the
jobs, retention does not expire it, and a job whose volume is gone all the same by the time it
starts fails `volume_gone` at once instead of cycling through the queue."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_person, build_pool, build_tenant, submit_job
from jobs.choices import JobState
from jobs.services import job_transition
from leases.choices import LeaseState
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from storage import services
from storage.models import Volume
from tests.clients import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool():
    return build_pool("vuse", exact_capacity=True)


@pytest.fixture
def tenant():
    return build_tenant("vuse-a")


@pytest.fixture
def alice(tenant):
    return build_person("vuse-alice", tenant=tenant)


def mounting(pool, tenant, volume, name="uses", read_only=False):
    mounts = [{"volume": volume.pk, "path": "/data", "read_only": read_only}]
    return submit_job(pool, tenant, name, volumes=mounts)


def test_a_volume_a_queued_job_mounts_cannot_be_deleted_until_the_job_is_gone(pool, tenant, alice):
    build_node(pool, "n1")
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=10, actor=SYSTEM)
    first = mounting(pool, tenant, volume, "first")
    second = mounting(pool, tenant, volume, "second", read_only=True)
    first_other = submit_job(pool, tenant, "unrelated")
    assert first.state == second.state == JobState.QUEUED  # no pass has run
    refused = client_for(alice).delete(f"/api/v1/volumes/{volume.pk}")
    assert refused.status_code == 409, refused.content
    body = refused.json()
    assert body["code"] == "volume_in_use" and body["jobs"] == [first.pk, second.pk]
    assert str(first.pk) in body["detail"] and first_other.pk not in body["jobs"]
    assert Volume.objects.get(pk=volume.pk).state == "available"
    for job in (first, second):
        job_transition(
            job=job, to=JobState.CANCELLED, actor=SYSTEM, reason=Reason.CANCELLED_BY_USER
        )
    deleted = client_for(alice).delete(f"/api/v1/volumes/{volume.pk}")
    assert deleted.status_code == 200 and deleted.json()["state"] == "deleted"


def test_retention_keeps_a_volume_a_queued_job_waits_for(pool, tenant):
    build_node(pool, "n1")
    past = timezone.now() - timedelta(days=3)
    waited = services.volume_create(
        tenant=tenant, pool=pool, name="w", size_mib=10, actor=SYSTEM, retention_days=1, now=past
    )
    idle = services.volume_create(
        tenant=tenant, pool=pool, name="i", size_mib=10, actor=SYSTEM, retention_days=1, now=past
    )
    job = mounting(pool, tenant, waited)
    assert services.expire_volumes() == 1
    states = dict(Volume.objects.values_list("name", "state"))
    assert states == {"w": "available", "i": "expired"}
    assert idle.pk
    job_transition(job=job, to=JobState.CANCELLED, actor=SYSTEM, reason=Reason.CANCELLED_BY_USER)
    assert services.expire_volumes() == 1  # no job waits for it any more
    assert Volume.objects.get(pk=waited.pk).state == "expired"


def test_a_submit_whose_volume_went_since_its_first_check_is_a_400_on_volumes(pool, tenant):
    """The submit's transaction locks the mounted volumes and checks them again: a delete that
    committed between the first check and that lock is seen there."""
    build_node(pool, "n1")
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=10, actor=SYSTEM)
    services.volumes_hold(tenant.pk, pool.pk, [{"volume": volume.pk}])  # live: nothing raised
    services.volume_delete(volume=volume, actor=SYSTEM)
    with pytest.raises(ValidationError) as error:
        services.volumes_hold(tenant.pk, pool.pk, [{"volume": volume.pk}])
    assert error.value.message_dict == {"volumes": ["Volume d is deleted."]}
    other = services.volume_create(
        tenant=build_tenant("vuse-b"), pool=pool, name="o", size_mib=10, actor=SYSTEM
    )
    with pytest.raises(ValidationError):  # another tenant's volume reads as none
        services.volumes_hold(tenant.pk, pool.pk, [{"volume": other.pk}])


def test_a_placed_job_whose_volume_is_gone_fails_volume_gone_at_its_start(pool, tenant):
    node = build_node(pool, "n1")
    volume = services.volume_create(tenant=tenant, pool=pool, name="d", size_mib=10, actor=SYSTEM)
    job = mounting(pool, tenant, volume)
    assert job.pk in scheduling_pass(pool_id=pool.pk).placed
    job.refresh_from_db()
    lease = job.leases.get(state=LeaseState.RESERVED)
    # gone all the same (a volume deleted before this rule existed, an operator's edit …)
    Volume.objects.filter(pk=volume.pk).update(state="deleted")
    body = {"fencing_token": str(lease.fencing_token), "step": "starting"}
    api = client_for(node=node)
    response = api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
    assert response.status_code == 409 and response.json()["code"] == "volume_gone"
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.events.order_by("id").last().reason == "volume_gone"
    assert lease.state not in (LeaseState.RESERVED, LeaseState.COMMITTED)
    # nothing cycles: the next pass has nothing of it to place
    assert job.pk not in scheduling_pass(pool_id=pool.pk).placed
