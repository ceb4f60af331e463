"""Scores on real data: node price and energy labels, the labels of the jobs on a node, affinity
and NUMA layouts reach the scheduler core. Each test submits through the API, runs the real
scheduling pass and looks at where the job landed."""

import pytest

from config.builders import (
    SYSTEM,
    TEST_IMAGE_TAG,
    build_node,
    build_person,
    build_pool,
    build_tenant,
    gpu_request,
    pinned_test_image,
    submit_job,
)
from jobs.models import Job
from jobs.services import job_submit
from leases import snapshot
from leases.models import Lease
from pools.models import SchedulingPolicy
from pools.services import policy_version_publish
from scheduling.passes import scheduling_pass

PRICE = "computepool.io/price-per-hour"
ENERGY = "computepool.io/energy-class"


@pytest.fixture
def npool(db):
    return build_pool("scores", exact_capacity=True)


@pytest.fixture
def client(npool, api):
    return api(build_person("scorer", tenant=build_tenant("scorers")))


def weigh(pool, **weights):
    policy = SchedulingPolicy.objects.get(pool=pool)
    policy_version_publish(policy=policy, weights=weights, actor=SYSTEM)


def submit(client, name, *, cpu=1000, memory=512, **fields):
    body = {
        "tenant": "scorers",
        "pool": "scores",
        "name": name,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": memory},
        "image": TEST_IMAGE_TAG,
        "command": ["true"],
        **fields,
    }
    return client.post("/api/v1/jobs/", body, format="json")


def submitted(client, name, **fields) -> int:
    response = submit(client, name, **fields)
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def node_of(job_id: int) -> str:
    job = Job.objects.get(pk=job_id)
    assert job.state == "leased", job.pending_reason
    return Lease.objects.get(job=job).node.name


def test_the_cheaper_node_wins_when_the_policy_weighs_price(client, npool):
    build_node(npool, "a-pricey", cpu=8000, memory=8192, labels={PRICE: "3.20"})
    build_node(npool, "b-cheap", cpu=8000, memory=8192, labels={PRICE: "0.45"})
    build_node(npool, "c-cheap-dirty", cpu=8000, memory=8192, labels={PRICE: "0.45", ENERGY: "D"})
    weigh(npool, price=1.0)
    first = submitted(client, "one")
    scheduling_pass()
    assert node_of(first) == "b-cheap"
    # b-cheap and c-cheap-dirty cost the same: c's energy class D (3) counts against it
    views = {n.name: n for n in snapshot.pool_snapshot(npool.pk).nodes}
    assert (views["b-cheap"].price_per_hour, views["c-cheap-dirty"].energy_class) == (0.45, 3)


def test_energy_class_breaks_a_price_tie(client, npool):
    build_node(npool, "a-class-c", cpu=8000, memory=8192, labels={PRICE: "1", ENERGY: "C"})
    build_node(npool, "b-class-a", cpu=8000, memory=8192, labels={PRICE: "1", ENERGY: "A"})
    weigh(npool, price=1.0)
    job = submitted(client, "green")
    scheduling_pass()
    assert node_of(job) == "b-class-a"


@pytest.mark.parametrize(
    "price, energy", [("free", "Z"), ("-3", "12"), ("nan", ""), ("1e999", "é")]
)
def test_a_bad_price_or_energy_label_is_ignored(client, npool, price, energy):
    build_node(npool, "odd", cpu=8000, memory=8192, labels={PRICE: price, ENERGY: energy})
    weigh(npool, price=1.0)
    job = submitted(client, "anyway")
    scheduling_pass()
    assert node_of(job) == "odd"
    (view,) = snapshot.pool_snapshot(npool.pk).nodes
    assert (view.price_per_hour, view.energy_class) == (0.0, 0)


def test_anti_affinity_keeps_two_labelled_jobs_apart(client, npool):
    build_node(npool, "n1", cpu=8000, memory=8192)
    build_node(npool, "n2", cpu=8000, memory=8192)
    rules = {"labels": {"app": "db"}, "anti_affinity": {"app": "db"}}
    first = submitted(client, "db-0", **rules)
    second = submitted(client, "db-1", **rules)
    other = submitted(client, "web", labels={"app": "web"})
    scheduling_pass()
    assert node_of(first) != node_of(second)
    assert Job.objects.get(pk=first).labels == {"app": "db"}
    # the node of db-0 shows the job's label to the core; a third db replica has nowhere to go
    views = {n.name: n for n in snapshot.pool_snapshot(npool.pk).nodes}
    assert "app=db" in views[node_of(first)].workload_labels
    assert "app=web" in views[node_of(other)].workload_labels
    third = submitted(client, "db-2", **rules)
    scheduling_pass()
    waiting = Job.objects.get(pk=third)
    assert waiting.state == "queued"
    assert waiting.pending_reason["reasons"] == {"anti_affinity": 2}


def test_affinity_pins_the_job_to_a_labelled_node(client, npool):
    build_node(npool, "a-plain", cpu=8000, memory=8192)
    build_node(npool, "b-hdd", cpu=8000, memory=8192, labels={"disk": "hdd"})
    build_node(npool, "c-ssd", cpu=8000, memory=8192, labels={"disk": "ssd"})
    response = submit(client, "fast-io", affinity={"disk": "ssd"})
    assert response.status_code == 201 and response.json()["affinity"] == {"disk": "ssd"}
    scheduling_pass()
    assert node_of(response.json()["id"]) == "c-ssd"
    # a label no node has: refused at submit, as any request no node could ever hold
    response = submit(client, "nowhere", affinity={"disk": "nvme"})
    assert response.status_code == 422 and response.json()["code"] == "never_fits"


def test_a_numa_requiring_job_lands_where_the_layout_fits(client, npool):
    split = [{"id": 0, "cpus": 8, "memory_mib": 4096}, {"id": 1, "cpus": 8, "memory_mib": 4096}]
    wide = [{"id": 0, "cpus": list(range(16)), "memory_mib": 8192}]
    build_node(npool, "a-split", cpu=16000, memory=8192, numa_layout=split, labels={PRICE: "1"})
    build_node(npool, "b-wide", cpu=16000, memory=8192, numa_layout=wide, labels={PRICE: "2"})
    weigh(npool, price=1.0)  # a-split is cheaper: it wins unless NUMA says otherwise
    aligned = submitted(client, "aligned", cpu=10000, require_numa=True)
    loose = submitted(client, "loose", cpu=10000)
    assert Job.objects.get(pk=aligned).require_numa is True
    scheduling_pass()
    assert (node_of(aligned), node_of(loose)) == ("b-wide", "a-split")
    lease = Lease.objects.get(job_id=aligned)
    assert lease.placement["numa_node"] == 0
    # what the lease pinned to NUMA node 0 is no longer free there
    views = {n.name: n for n in snapshot.pool_snapshot(npool.pk).nodes}
    assert [(v.id, v.free_cpu_millicores) for v in views["b-wide"].numa] == [(0, 6000)]


def test_labels_and_selectors_are_validated(client, npool):
    build_node(npool, "n1", cpu=8000, memory=8192)
    too_many = {f"k{i}": "v" for i in range(33)}
    for field, value in [
        ("labels", too_many),
        ("labels", {"bad key": "v"}),
        ("labels", {"k": 3}),
        ("labels", ["app=db"]),
        ("affinity", {"k": "x" * 129}),
        ("anti_affinity", {"-k": "v"}),
        ("anti_affinity", "app=db"),
    ]:
        response = submit(client, "bad", **{field: value})
        assert response.status_code == 400, (field, value)
        assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_the_pass_keeps_memory_where_gpus_would_be_stranded_without_it(npool):
    """The default policy measures fragmentation against the window's own mix (memory_fgd):
    with GPU work asking 12 GiB a GPU in the queue, a CPU-only job of 12 GiB (first in the
    queue) goes to the node with memory to spare, not to the tight one whose GPUs it would
    leave without the memory to use them."""
    tenant = build_tenant("mix")
    # named so that a tie would go to the tight node (the smallest name wins a tie)
    roomy = build_node(npool, "gpu-b-roomy", cpu=32000, memory=65536, gpus=[{}, {}])
    build_node(npool, "gpu-a-tight", cpu=32000, memory=16384, gpus=[{}, {}])
    cpu_job = submit_job(npool, tenant, "cpu", cpu=1000, memory=12288)
    gpu_jobs = [
        job_submit(
            tenant=tenant,
            pool=npool,
            name=f"gpu-{i}",
            image=pinned_test_image(),
            actor=SYSTEM,
            resources=gpu_request(count=1, memory=12288),
        )
        for i in range(6)
    ]
    placed = scheduling_pass().placed
    assert placed[0] == cpu_job.pk and set(placed[1:]) <= {job.pk for job in gpu_jobs}
    decision = Lease.objects.get(job=cpu_job).placement["decision"]
    assert decision["chosen"] == roomy.name
    scores = {c["node"]: c["breakdown"]["memory_fgd"] for c in decision["candidates"]}
    assert scores[roomy.name] > scores["gpu-a-tight"]
