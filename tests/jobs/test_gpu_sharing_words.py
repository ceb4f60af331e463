"""What each GPU sharing class isolates, said where a tenant chooses or reads one: the jobs,
leases and shapes APIs carry it in words (a time-slice share: no memory or compute isolation,
no memory reserved), the console shows it, and an MPS share's caps reach the agent as exactly
what the ledger reserved (placement.devices.mps_memory_mib, one rule)."""

import html

import pytest
from django.urls import reverse

from config.builders import TEST_IMAGE_TAG, build_node, build_node_credential
from leases.models import Lease
from nodes.models import GpuDevice
from placement.devices import mps_memory_mib
from pools.gpu_sharing import GPU_SHARING_NOTES
from pools.models import ResourceShape
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client

TIMESLICE = {"gpu_sharing_class": "timeslice", "gpu_count": 1, "gpu_milli": 250}
MPS = {"gpu_sharing_class": "mps", "gpu_count": 1, "gpu_milli": 250}
NO_ISOLATION = "no memory or compute isolation"
ALL_MEMORY = "Another job can use all of the GPU's memory"


def submit(client, resources, pool="test"):
    body = {"tenant": "vision", "pool": pool, "name": "gpu", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | resources
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def shared_nodes(pool):
    build_node(pool, "ts", cpu=16000, memory=65536, gpus=[{"sharing_mode": "timeslice"}])
    build_node(pool, "mps", cpu=16000, memory=65536, gpus=[{"sharing_mode": "mps"}])


def test_a_time_slice_job_and_its_lease_say_what_they_do_not_isolate(api, member, shared_nodes):
    client = api(member)
    job = submit(client, TIMESLICE)
    assert NO_ISOLATION in job["gpu_sharing_note"] and ALL_MEMORY in job["gpu_sharing_note"]
    assert "no amount of it is reserved" in job["gpu_sharing_note"]
    assert scheduling_pass().placed == [job["id"]]
    lease = Lease.objects.get(job_id=job["id"])
    shown = client.get(f"/api/v1/compute-leases/{lease.pk}/").json()
    assert shown["gpu_sharing_note"] == job["gpu_sharing_note"]
    # the lease holds a compute share of the device and no GPU memory at all
    [alloc] = shown["gpu_allocations"]
    assert alloc["milli"] == 250 and not any("memory" in key for key in alloc)


def test_the_shapes_api_says_it_per_shape(api, member, pool):
    ResourceShape.objects.create(
        pool=pool, name="quarter-ts", cpu_millicores_min=500, memory_mib_min=256, **TIMESLICE
    )
    ResourceShape.objects.create(pool=pool, name="cpu", cpu_millicores_min=500, memory_mib_min=256)
    shapes = {s["name"]: s for s in api(member).get("/api/v1/shapes/").json()["results"]}
    assert shapes["quarter-ts"]["gpu_sharing_note"] == GPU_SHARING_NOTES["timeslice"]
    assert shapes["cpu"]["gpu_sharing_note"] == ""


def test_an_mps_assignment_carries_the_caps_the_ledger_reserved(api, member, shared_nodes):
    job = submit(api(member), MPS)
    assert "MPS share" in job["gpu_sharing_note"]
    assert job["gpu_isolation"] == "shared-not-isolated"
    assert scheduling_pass().placed == [job["id"]]
    lease = Lease.objects.get(job_id=job["id"])
    device = GpuDevice.objects.get(node=lease.node)
    [alloc] = lease.gpu_allocations
    client = bearer_client(build_node_credential(lease.node))
    [entry] = client.get("/api/v1/agent/assignments").json()
    assert entry["limits"]["mps"] == [
        {
            "gpu": device.uuid,
            "milli": alloc["milli"],
            "thread_percentage": 25,
            "memory_mib": mps_memory_mib(device.memory_mib, alloc["milli"]),
        }
    ]
    assert entry["limits"]["mps"][0]["memory_mib"] == device.memory_mib * 250 // 1000


def test_a_time_slice_assignment_carries_no_mps_caps(api, member, shared_nodes):
    job = submit(api(member), TIMESLICE)
    assert scheduling_pass().placed == [job["id"]]
    lease = Lease.objects.get(job_id=job["id"])
    [entry] = (
        bearer_client(build_node_credential(lease.node)).get("/api/v1/agent/assignments").json()
    )
    assert "mps" not in entry["limits"]


def test_an_mps_share_s_gpu_memory_minimum_is_its_share_of_the_device(api, member, shared_nodes):
    """For MPS, gpu_memory_mib_min is compared with the memory the share is capped at (a
    quarter of an 80 GB H100 is about 20 GB); for a time-slice share, with the device's."""
    device_memory = GpuDevice.objects.get(node__name="mps").memory_mib
    fits = submit(api(member), MPS | {"gpu_memory_mib_min": device_memory // 4 - 100})
    assert scheduling_pass().placed == [fits["id"]]
    body = {"tenant": "vision", "pool": "test", "name": "gpu", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | MPS
    body["resources"]["gpu_memory_mib_min"] = device_memory // 2  # half: twice its share
    refused = api(member).post("/api/v1/jobs/", body, format="json")
    assert refused.status_code == 422 and refused.json()["code"] == "never_fits"
    assert "gpu_memory_too_small" in refused.json()["message"]
    timeslice = submit(api(member), TIMESLICE | {"gpu_memory_mib_min": device_memory // 2})
    assert scheduling_pass().placed == [timeslice["id"]]


def test_the_console_job_page_and_submit_form_say_it(client, api, member, shared_nodes):
    job = submit(api(member), TIMESLICE)
    client.force_login(member)
    page = html.unescape(client.get(reverse("console-job", args=[job["id"]])).content.decode())
    assert 'id="gpu-sharing-note"' in page and NO_ISOLATION in page and ALL_MEMORY in page
    form = html.unescape(client.get(reverse("console-job-new")).content.decode())
    assert 'id="gpu-sharing-notes"' in form
    assert NO_ISOLATION in form and "MPS share" in form and "MIG slice" in form
