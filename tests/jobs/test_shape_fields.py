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
    "gpu_compute_capability_min": (  # with a memory minimum both nodes meet
        {"gpus": [{"compute_capability": "7.5"}]},
        {"gpus": [{"compute_capability": "8.6"}]},
        GPU | {"gpu_memory_mib_min": 40960, "gpu_compute_capability_min": "8.0"},
        {},
    ),
    "node_features_required": (  # two nodes that differ only in what their agents report
        {"features": ["sgx"]},
        {"features": ["avx512", "sgx"]},
        {"node_features_required": ["avx512"]},
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
        (GPU | {"gpu_compute_capability_min": "8"}, "gpu_compute_capability_min"),
        (GPU | {"gpu_compute_capability_min": "sm_80"}, "gpu_compute_capability_min"),
        (GPU | {"gpu_compute_capability_min": "8.0.1"}, "gpu_compute_capability_min"),
        (GPU | {"gpu_compute_capability_min": ["8.0"]}, "gpu_compute_capability_min"),
        ({"gpu_compute_capability_min": "8.0"}, "gpu_compute_capability_min"),  # no GPUs
        ({"node_features_required": "avx512"}, "node_features_required"),  # not a list
        ({"node_features_required": [512]}, "node_features_required"),  # not a name
        ({"node_features_required": [["avx512"]]}, "node_features_required"),
        ({"node_features_required": ["AVX512"]}, "node_features_required"),  # not lowercased
        ({"node_features_required": [""]}, "node_features_required"),
        ({"node_features_required": ["-avx"]}, "node_features_required"),
        ({"node_features_required": ["avx 512"]}, "node_features_required"),
        ({"node_features_required": ["a" * 41]}, "node_features_required"),
        ({"node_features_required": ["avx512", "avx512"]}, "node_features_required"),
        ({"node_features_required": [f"f{i}" for i in range(17)]}, "node_features_required"),
        ({"node_features_required": None}, "node_features_required"),
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


def test_a_compute_capability_no_registered_node_has_never_fits(api, member, pool):
    build_node(pool, "ampere", **CPU_NODE | {"gpus": [{"compute_capability": "8.6"}]})
    build_node(pool, "turing", **CPU_NODE | {"gpus": [{"compute_capability": "7.5"}]})
    body = {"tenant": "vision", "pool": "test", "name": "hopper", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256} | GPU
    body["resources"]["gpu_compute_capability_min"] = "10.0"  # "10.0" > "9.0" > "8.6"
    response = api(member).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "never_fits"
    assert "gpu_compute_capability_too_low" in str(response.json())
    assert not Job.objects.filter(name="hopper").exists()


def test_a_node_feature_no_registered_node_has_never_fits(api, member, pool):
    build_node(pool, "a", **CPU_NODE, features=["avx512"])
    build_node(pool, "b", **CPU_NODE, features=["infiniband"])
    body = {"tenant": "vision", "pool": "test", "name": "enclave", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256}
    body["resources"]["node_features_required"] = ["avx512", "sgx"]  # each node lacks one
    response = api(member).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "never_fits"
    assert "node_feature_missing" in str(response.json())
    assert not Job.objects.filter(name="enclave").exists()


def test_a_feature_a_heartbeat_brings_lets_a_waiting_job_land(api, member, pool):
    """The job is queued while a node has the feature; the node's heartbeat drops it (the job
    waits, explained), and brings it back (the job lands)."""
    from nodes.services import node_heartbeat

    node = build_node(pool, "a", **CPU_NODE, features=["avx512"])
    job = submit(api(member), {"node_features_required": ["avx512"]})
    node_heartbeat(node=node, actor=SYSTEM, features=["sgx"])  # e.g. a BIOS change
    assert scheduling_pass().placed == []
    assert Job.objects.get(pk=job).pending_reason["reasons"] == {"node_feature_missing": 1}
    node_heartbeat(node=node, actor=SYSTEM, features=["avx512"])
    assert landed_on(job) == "a"


ZONES = {"a1": "a", "a2": "a", "b1": "b"}


@pytest.fixture
def zoned(pool, api, member):
    """Three ready nodes, two in zone a and one in zone b, and a job labelled app=web running in
    zone a (on a1: ties go to the smaller name)."""
    for name, zone in ZONES.items():
        build_node(pool, name, **CPU_NODE, zone=zone)
    client = api(member)
    web = submit(client, labels={"app": "web"})
    assert landed_on(web) == "a1"
    return client


def test_zone_anti_affinity_keeps_the_job_out_of_the_zone_running_the_label(zoned, pool):
    job = submit(zoned, anti_affinity={"app": "web"}, anti_affinity_scope="zone")
    assert Job.objects.get(pk=job).anti_affinity_scope == "zone"
    assert landed_on(job) == "b1"
    # b1 taken by another app=web job: no zone is free of it, and the job waits, explained
    job_cancel(job=Job.objects.get(pk=job), actor=SYSTEM)
    assert landed_on(submit(zoned, labels={"app": "web"}, resources={"node_pin": "b1"})) == "b1"
    waiting = submit(zoned, anti_affinity={"app": "web"}, anti_affinity_scope="zone")
    assert scheduling_pass().placed == []
    assert Job.objects.get(pk=waiting).pending_reason["reasons"] == {"anti_affinity": 3}
    assert ledger_problems(pool) == []


def test_host_anti_affinity_avoids_only_the_node_running_the_label(zoned):
    job = submit(zoned, anti_affinity={"app": "web"})  # scope host, the default
    assert Job.objects.get(pk=job).anti_affinity_scope == "host"
    assert landed_on(job) != "a1"  # a2 or b1, as the scores decide


def test_the_single_path_sees_the_zones_work_on_nodes_it_cannot_place_on(zoned, pool):
    """lease_reserve (the pass's fallback and POST /compute-leases) reads the work of a zone's
    nodes the snapshot leaves out: the app=web job still runs on a draining a1."""
    from leases.services import lease_reserve
    from nodes.services import node_drain

    node_drain(node=pool.nodes.get(name="a1"), actor=SYSTEM)
    request = {"cpu_millicores_min": 500, "memory_mib_min": 256, "gpu_sharing_class": "none"}
    request |= {"anti_affinity": {"app": "web"}, "anti_affinity_scope": "zone"}
    tenant = Job.objects.first().tenant
    lease = lease_reserve(pool=pool, tenant=tenant, request=request, actor=SYSTEM, duration=60)
    assert lease.node.name == "b1"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"anti_affinity_scope": "rack", "anti_affinity": {"app": "web"}}, "not a valid choice"),
        ({"anti_affinity_scope": "zone"}, "needs anti_affinity"),
        (
            {
                "anti_affinity_scope": "zone",
                "anti_affinity": {"app": "web"},
                "gang": {"name": "g", "size": 2, "topology": "none"},
            },
            "not gangs",
        ),
    ],
)
def test_an_anti_affinity_scope_that_cannot_take_effect_is_a_field_error(
    api, member, pool, fields, why
):
    body = {"tenant": "vision", "pool": "test", "name": "bad", "image": TEST_IMAGE_TAG}
    body["resources"] = {"cpu_millicores_min": 500, "memory_mib_min": 256}
    response = api(member).post("/api/v1/jobs/", body | fields, format="json")
    assert response.status_code == 400, response.json()
    assert why in " ".join(response.json()["anti_affinity_scope"])
