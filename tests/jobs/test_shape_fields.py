"""Every preference and minimum a shape or a job accepts takes effect on the product path: the
API's submit → the real scheduling pass → the node the job lands on, between two ready nodes
that differ in that one dimension (recorded GPU inventories stand in for real devices). Without
the field each job would land on `a` (the smaller name breaks the tie); with it, on `b`."""

import pytest

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, pinned_test_image
from jobs.models import Job
from jobs.services import job_cancel
from leases.models import Lease
from leases.selectors import ledger_problems
from pools.services import policy_version_publish
from scheduling.passes import scheduling_pass

GPU = {"gpu_sharing_class": "exclusive", "gpu_count": 1}
CPU_NODE = {"cpu": 16000, "memory": 65536}


def submit(client, resources=None, **fields):
    body = {"tenant": "vision", "pool": "test", "name": "fields", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | (resources or {})
    response = client.post("/api/v1/jobs/", body | fields, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def landed_on(job_id) -> str:
    assert scheduling_pass().placed == [job_id], Job.objects.get(pk=job_id).pending_reason
    return Lease.objects.get(job_id=job_id).node.name


CASES = {
    "regions_preferred": ({"region": "r1"}, {"region": "r2"}, {"regions_preferred": ["r2"]}, {}),
    "zones_preferred": ({"zone": "z1"}, {"zone": "z2"}, {"zones_preferred": ["z2"]}, {}),
    "affinity_preferred": (
        {},
        {"labels": {"disk": "ssd"}},
        {},
        {"affinity_preferred": {"disk": "ssd"}},
    ),
    "trust_level_min": ({"trust_level": 0}, {"trust_level": 2}, {"trust_level_min": 2}, {}),
    "gpu_count_preferred": (
        {"gpus": [{}, {}]},
        {"gpus": [{}, {}, {}, {}]},
        GPU | {"gpu_count_preferred": 4},
        {},
    ),
    "gpu_memory_mib_preferred": (
        {"gpus": [{"memory_mib": 40960}]},
        {"gpus": [{}]},
        GPU | {"gpu_memory_mib_min": 20000, "gpu_memory_mib_preferred": 80000},
        {},
    ),
    "gpu_driver_version_min": (
        {"gpus": [{"driver_version": "535.104.05"}]},
        {"gpus": [{}]},
        GPU | {"gpu_driver_version_min": "550"},
        {},
    ),
    "gpu_cuda_version_min": (
        {"gpus": [{"cuda_version": "12.2"}]},
        {"gpus": [{}]},
        GPU | {"gpu_cuda_version_min": "12.4"},
        {},
    ),
    "gpu_interconnect_required": (
        {"gpus": [{"interconnect_group": ""}, {"interconnect_group": ""}]},
        {"gpus": [{}, {}]},
        GPU | {"gpu_count": 2, "gpu_interconnect_required": True},
        {},
    ),
}


@pytest.mark.parametrize("field", sorted(CASES))
def test_each_field_moves_the_job_to_the_node_that_has_what_it_asks(api, member, pool, field):
    a, b, resources, job_fields = CASES[field]
    build_node(pool, "a", **CPU_NODE | a)
    build_node(pool, "b", **CPU_NODE | b)
    client = api(member)
    without = submit(client, {k: v for k, v in resources.items() if k != field})
    assert landed_on(without) == "a"
    job_cancel(job=Job.objects.get(pk=without), actor=SYSTEM)  # `a` as empty as before
    assert landed_on(submit(client, resources, **job_fields)) == "b"
    assert ledger_problems(pool) == []


def test_a_preference_granted_less_is_in_the_decision_record_with_how_much(api, member, pool):
    build_node(pool, "two", **CPU_NODE | {"gpus": [{}, {}]})
    job = submit(api(member), GPU | {"gpu_count_preferred": 4})
    assert landed_on(job) == "two"
    placement = Lease.objects.get(job_id=job).placement
    assert placement["grants"]["gpu_count"] == {"minimum": 1, "preferred": 4, "granted": 1}
    assert placement["degraded"] == {"gpu_count": 3}  # all or the minimum


def test_a_required_warm_image_waits_for_a_node_that_holds_it(api, member, pool):
    build_node(pool, "cold", **CPU_NODE)
    client = api(member)
    job = submit(client, {"warm_image_required": True})
    assert scheduling_pass().placed == []
    assert Job.objects.get(pk=job).pending_reason["reasons"] == {"image_not_warm": 1}
    digest = pinned_test_image().rsplit("@", 1)[1]
    build_node(pool, "warm", **CPU_NODE | {"cached_images": [digest]})
    assert landed_on(job) == "warm"


def test_the_price_scorer_reads_the_nodes_own_price_and_energy_class(api, member, pool):
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=current.policy, weights={"price": 1.0}, knobs=current.knobs, actor=SYSTEM
    )
    build_node(pool, "a", **CPU_NODE | {"price_class": "2.5", "energy_class": "C"})
    build_node(pool, "b", **CPU_NODE | {"price_class": "0.5", "energy_class": "A"})
    assert landed_on(submit(api(member))) == "b"


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"gpu_count_preferred": 2}, "gpu_count_preferred"),  # no GPUs asked
        (GPU | {"gpu_count_preferred": 0, "gpu_count": 2}, "gpu_count_preferred"),
        (
            GPU | {"gpu_memory_mib_min": 100, "gpu_memory_mib_preferred": 50},
            "gpu_memory_mib_preferred",
        ),
        (GPU | {"gpu_driver_version_min": "latest"}, "gpu_driver_version_min"),
        (GPU | {"gpu_interconnect_required": True}, "gpu_interconnect_required"),  # one GPU
        ({"regions_preferred": "r1"}, "regions_preferred"),
        ({"zones_preferred": [["a"]]}, "zones_preferred"),  # a list of lists
        ({"trust_level_min": 2**63}, "trust_level_min"),
        (GPU | {"gpu_cuda_version_min": "12..4"}, "gpu_cuda_version_min"),
        ({"warm_image_required": "yes please"}, "warm_image_required"),
    ],
)
def test_a_field_that_cannot_take_effect_is_a_field_error(api, member, pool, resources, field):
    body = {"tenant": "vision", "pool": "test", "name": "bad", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | resources
    response = api(member).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in str(response.json())


def test_every_field_the_docs_table_names_is_a_field_the_api_takes():
    import re
    from pathlib import Path

    from pools.models.catalogue import REQUEST_FIELDS

    text = Path(__file__).resolve().parents[2].joinpath("docs", "scheduler.md").read_text()
    section = text.split("## Shapes: what a request may ask", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(REQUEST_FIELDS)


def test_preferred_labels_that_are_not_a_label_map_are_a_field_error(api, member, pool):
    body = {"tenant": "vision", "pool": "test", "name": "bad", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256}
    for bad in ([["disk", "ssd"]], {"disk": ["ssd"]}, {"disk space": "ssd"}):
        response = api(member).post(
            "/api/v1/jobs/", body | {"affinity_preferred": bad}, format="json"
        )
        assert response.status_code == 400, (bad, response.content)
        assert "affinity_preferred" in response.json()
    nul = {"affinity_preferred": {"di\x00sk": "a"}}
    refused = api(member).post("/api/v1/jobs/", body | nul, format="json")
    assert (refused.status_code, refused.json()["code"]) == (400, "parse_error")  # before parsing
