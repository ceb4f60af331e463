"""How a job's GPUs are isolated, said to the agent (limits.gpu_isolation) and to the tenant
(`gpu_isolation` on the job): whole devices, MIG instances, or time-slice/MPS shares that are
not isolated and never mix tenants on one device unless the pool allows it."""

import pytest

from config.builders import TEST_IMAGE_TAG, build_node, build_node_credential, build_pool
from leases.models import Lease
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client

TIMESLICE = {"gpu_sharing_class": "timeslice", "gpu_count": 1, "gpu_milli": 500}
MIG = {"gpu_sharing_class": "mig", "gpu_count": 1, "mig_profile": "3g.40gb"}
EXCLUSIVE = {"gpu_sharing_class": "exclusive", "gpu_count": 1}


def submit(client, resources, tenant="vision", pool="test"):
    body = {"tenant": tenant, "pool": pool, "name": "gpu", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | resources
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def shown(client, job):
    return client.get(f"/api/v1/jobs/{job['id']}/").json()


@pytest.fixture
def gpu_nodes(pool):
    """One node per GPU sharing mode, each with one device."""
    build_node(pool, "whole", cpu=16000, memory=65536, gpus=[{}])
    build_node(pool, "ts", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])
    build_node(pool, "mig", cpu=16000, memory=65536, gpus=[{"mig_enabled": True}])


@pytest.mark.parametrize(
    ("resources", "isolation"),
    [(EXCLUSIVE, "exclusive"), (TIMESLICE, "shared-not-isolated"), (MIG, "mig")],
)
def test_the_agent_and_the_tenant_are_told_how_the_gpus_are_isolated(
    api, member, gpu_nodes, resources, isolation
):
    client = api(member)
    job = submit(client, resources)
    assert job["gpu_isolation"] == isolation
    assert scheduling_pass().placed == [job["id"]]
    node = Lease.objects.get(job_id=job["id"]).node  # a whole device may be a time-slice one's
    [entry] = bearer_client(build_node_credential(node)).get("/api/v1/agent/assignments").json()
    assert entry["job"] == job["id"]
    assert entry["limits"]["gpu_isolation"] == isolation
    assert len(entry["limits"]["gpus"]) == 1


def test_a_job_without_gpus_says_none(api, member, gpu_nodes):
    job = submit(api(member), {})
    assert job["gpu_isolation"] == "none"


@pytest.fixture
def one_shared_gpu(pool):
    return build_node(pool, "ts", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])


def test_time_slice_shares_never_mix_tenants_by_default(
    api, member, outsider, one_shared_gpu, other_tenant
):
    first = submit(api(member), TIMESLICE)
    second = submit(api(outsider), TIMESLICE, tenant="nlp")
    assert scheduling_pass().placed == [first["id"]]
    waiting = shown(api(outsider), second)
    # room on the device (500 of 1000 left), but it holds another tenant's share
    assert waiting["state"] == "queued"
    assert waiting["pending_reason"]["reasons"] == {"tenant_mixing_refused": 1}
    same_tenant = submit(api(member), TIMESLICE)
    # the other tenant's job is ahead (fair share) and waits for this device: the tenant's own
    # second share would delay it (backfill), so it waits until that job is gone
    assert scheduling_pass().placed == []
    assert shown(api(member), same_tenant)["pending_reason"]["code"] == "backfill_would_delay_head"
    assert api(outsider).post(f"/api/v1/jobs/{second['id']}/cancel").status_code == 200
    assert scheduling_pass().placed == [same_tenant["id"]]  # the tenant's own share fits


def test_a_pool_that_allows_mixing_shares_the_device_across_tenants(
    api, member, outsider, other_tenant
):
    pool = build_pool("mixed", allow_tenant_mixing_on_shared_gpus=True)
    build_node(pool, "ts", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])
    first = submit(api(member), TIMESLICE, pool="mixed")
    second = submit(api(outsider), TIMESLICE, tenant="nlp", pool="mixed")
    assert sorted(scheduling_pass().placed) == sorted([first["id"], second["id"]])
    assert shown(api(outsider), second)["gpu_isolation"] == "shared-not-isolated"
