"""Gangs of jobs on the product path: members submitted through the API share a gang name, and
the real scheduling pass places every member of a gang together or none of them; and
`form_gangs`, which forms them alike for both paths."""

from types import SimpleNamespace

import pytest

from config.builders import (
    TEST_IMAGE_TAG,
    build_node,
    build_person,
    build_pool,
    build_tenant,
)
from jobs.choices import JobState
from jobs.models import Job
from leases.models import Lease
from leases.selectors import ledger_problems
from placement import Request
from scheduling.pass_steps.gangs import form_gangs
from scheduling.passes import scheduling_pass
from tests.scheduling.conftest import another_writer_takes_before_apply


@pytest.fixture
def gpool(db):
    return build_pool("gangs", exact_capacity=True)


@pytest.fixture(params=["batch", "single"])
def path(request, settings):
    """Both ways a pass places: the batch plan (PostgreSQL) and the single path (what SQLite,
    `make run`'s embedded default, takes, all of it: its snapshot, ledger writes and pass; and
    the fallback after a failed plan)."""
    if request.param == "single":
        settings.LEASE_PORTABLE_PATHS = True
    return request.param


@pytest.fixture
def gtenant(db):
    return build_tenant("gangers")


@pytest.fixture
def client(gpool, gtenant, api):
    return api(build_person("gina", tenant=gtenant))


def submit(client, name, *, gang, cpu=2000, memory=512):
    body = {
        "tenant": "gangers",
        "pool": "gangs",
        "name": name,
        "resources": {"cpu_millicores_min": cpu, "memory_mib_min": memory},
        "image": TEST_IMAGE_TAG,
        "command": ["true"],
        "gang": gang,
    }
    return client.post("/api/v1/jobs/", body, format="json")


def members(client, count, topology, *, name="train", size=4, **fields) -> list[int]:
    gang = {"name": name, "size": size, "topology": topology}
    ids = []
    for i in range(count):
        response = submit(client, f"{name}-{i}", gang=gang, **fields)
        assert response.status_code == 201, response.json()
        assert response.json()["gang"] == gang
        ids.append(response.json()["id"])
    return ids


def nodes_of(job_ids) -> list[str]:
    jobs = Job.objects.filter(pk__in=job_ids)
    assert all(job.state == JobState.LEASED for job in jobs), [j.pending_reason for j in jobs]
    return [lease.node.name for lease in Lease.objects.filter(job_id__in=job_ids)]


def assert_none_placed(job_ids, code: str) -> list[Job]:
    jobs = list(Job.objects.filter(pk__in=job_ids))
    assert len(jobs) == len(job_ids)
    assert all(job.state == JobState.QUEUED for job in jobs)
    assert all(job.pending_reason["code"] == code for job in jobs), [
        job.pending_reason for job in jobs
    ]
    assert not Lease.objects.filter(job_id__in=job_ids).exists()
    return jobs


def test_a_colocate_rack_gang_is_placed_whole_in_one_rack(client, gpool, path):
    # rack a holds two members, rack b all four: the gang goes to rack b, never split
    for name, rack in (("a1", "a"), ("b1", "b"), ("b2", "b")):
        build_node(gpool, name, cpu=4000, memory=8192, rack=rack)
    ids = members(client, 4, "colocate_rack")
    result = scheduling_pass()
    assert sorted(result.placed) == sorted(ids)
    assert sorted(nodes_of(ids)) == ["b1", "b1", "b2", "b2"]
    if path == "batch":  # the batch plan's decision record names the gang and its rack
        decision = Lease.objects.filter(job_id=ids[0]).get().placement["decision"]
        assert decision["gang"] == "train" and decision["domain"] == "b"
    else:  # the single path says so on the member's `placed` event
        assert Job.objects.get(pk=ids[0]).events.get(reason="placed").data["gang"] == "train"


def test_an_incomplete_gang_waits_until_its_last_member_arrives(client, gpool, path):
    for name in ("n1", "n2"):
        build_node(gpool, name, cpu=8000, memory=8192, rack="r1")
    first = members(client, 3, "colocate_rack")
    result = scheduling_pass()
    assert result.placed == []
    for job in assert_none_placed(first, "gang_incomplete"):
        assert job.pending_reason["message"] == "3 of 4 members queued"
    last = members(client, 1, "colocate_rack", name="train")
    result = scheduling_pass()
    assert sorted(result.placed) == sorted(first + last)
    assert len(nodes_of(first + last)) == 4


def test_the_whole_queue_counts_not_only_the_pass_window(client, gpool, path):
    build_node(gpool, "n1", cpu=16000, memory=8192)
    ids = members(client, 4, "none")
    result = scheduling_pass(limit=2)  # the window holds two members; the pass reads the others
    assert sorted(result.placed) == sorted(ids)


def test_a_spread_hosts_gang_lands_on_four_different_nodes(client, gpool, path):
    for i in range(5):
        build_node(gpool, f"n{i}", cpu=16000, memory=8192)
    ids = members(client, 4, "spread_hosts")
    scheduling_pass()
    assert len(set(nodes_of(ids))) == 4


def test_a_gang_that_cannot_fit_places_no_member_and_says_why(client, gpool, path):
    for i in range(3):  # spread_hosts needs four nodes; each node could hold them all
        build_node(gpool, f"n{i}", cpu=16000, memory=8192)
    # a fourth, not ready: the gang could fit whole (no 422 at submit), just not now
    build_node(gpool, "n3", cpu=16000, memory=8192, ready=False)
    ids = members(client, 4, "spread_hosts")
    result = scheduling_pass()
    assert result.placed == []
    for job in assert_none_placed(ids, "no_capacity"):
        assert job.pending_reason["gang_reason"] == "gang_unplaceable"
        assert job.pending_reason["total_nodes"] == 3
        assert "4 replicas cannot all be placed (spread_hosts)" in job.pending_reason["message"]


def test_members_asking_for_different_resources_wait_as_a_mismatch(client, gpool, path):
    build_node(gpool, "n1", cpu=16000, memory=8192)
    ids = members(client, 3, "none") + members(client, 1, "none", cpu=1000)
    scheduling_pass()
    assert_none_placed(ids, "gang_mismatch")


def test_a_node_taken_before_apply_places_no_member_of_the_gang(client, gpool, gtenant):
    for name in ("n1", "n2"):  # each node holds exactly one member
        build_node(gpool, name, cpu=2000, memory=4096)
    build_node(gpool, "n3", cpu=1000, memory=4096)  # a job outside the gang, placed all the same
    ids = members(client, 2, "spread_hosts", size=2)
    single = submit(client, "single", gang={}, cpu=1000).json()["id"]
    with another_writer_takes_before_apply(gtenant, "n1", cpu=2000):
        result = scheduling_pass()
    assert result.placed == [single]
    assert result.pending == {pk: "plan_conflict" for pk in ids}
    for job in assert_none_placed(ids, "plan_conflict"):
        assert "n1" in job.pending_reason["message"]
    assert ledger_problems(gpool) == []


@pytest.mark.parametrize(
    "gang",
    [
        {"name": "bad name!", "size": 4},
        {"name": "train", "size": 1},
        {"name": "train", "size": 65},
        {"name": "train", "size": "4"},
        {"name": "train", "size": 4, "topology": "ring"},
        {"name": "train", "size": 4, "colour": "red"},
        {"name": "x" * 61, "size": 4},
        ["train"],
    ],
)
def test_an_invalid_gang_is_refused_400_naming_the_field(client, gpool, gang):
    build_node(gpool, "n1", cpu=16000, memory=8192)
    response = submit(client, "bad", gang=gang)
    assert response.status_code == 400, response.json()
    assert "gang" in response.json()
    assert not Job.objects.exists()


def test_a_gang_stored_broken_fails_its_own_job_and_the_pass_goes_on(client, gpool, path):
    build_node(gpool, "n1", cpu=16000, memory=8192)
    broken, fine = members(client, 1, "none", size=2), submit(client, "fine", gang={})
    Job.objects.filter(pk=broken[0]).update(gang={"size": 2})  # behind the API's back
    result = scheduling_pass()
    assert result.placed == [fine.json()["id"]]
    job = Job.objects.get(pk=broken[0])
    assert job.state == JobState.FAILED and job.events.last().reason == "scheduling_error"


# --- form_gangs, the one function both paths form gangs with ----------------------------------


def gang_job(pk: int, name: str = "train", size: int = 2, topology: str = "none", tenant: int = 1):
    return SimpleNamespace(
        pk=pk, tenant_id=tenant, gang={"name": name, "size": size, "topology": topology}
    )


def test_members_in_id_order_make_gangs_of_their_size_in_queue_order():
    members = [gang_job(5, "b"), gang_job(3), gang_job(1), gang_job(4, "b"), gang_job(2)]
    ask = {pk: Request(cpu_millicores=1000, name=f"rank-{pk}") for pk in range(1, 6)}
    formed = form_gangs(members, ask)
    assert [type(g).__name__ for g in formed] == ["Gang", "Gang", "GangWaits"]
    b, train, rest = formed
    assert [j.pk for j in b.members] == [4, 5] and b.name == "b"
    assert [j.pk for j in train.members] == [1, 2] and train.replicas.replicas == 2
    assert [j.pk for j in rest.members] == [3]  # the name used again: the next gang, incomplete
    assert rest.explanation == {"code": "gang_incomplete", "message": "1 of 2 members queued"}


def test_members_that_disagree_wait_with_one_mismatch_message():
    message = "the members of gang train ask for different resources, size or topology"
    mismatch = {"code": "gang_mismatch", "message": message}
    ask = {1: Request(cpu_millicores=1000), 2: Request(cpu_millicores=2000)}
    (differ,) = form_gangs([gang_job(1), gang_job(2)], ask)
    assert differ.explanation == mismatch
    ask[2] = ask[1]
    (disagree,) = form_gangs([gang_job(1), gang_job(2, topology="spread_hosts")], ask)
    assert disagree.explanation == mismatch and len(disagree.members) == 2
    tenants = form_gangs([gang_job(1), gang_job(2, tenant=2)], ask)  # a gang is one tenant's
    assert [g.explanation["code"] for g in tenants] == ["gang_incomplete"] * 2


def test_a_gang_that_could_never_be_placed_whole_is_refused_at_submit(client, gpool):
    """Queued with "would fit" before: each member fits, the gang of them never does."""
    build_node(gpool, "a", cpu=4000, memory=8192)
    build_node(gpool, "b", cpu=4000, memory=8192)
    three_hosts = {"name": "wide", "size": 3, "topology": "spread_hosts"}
    refused = submit(client, "wide-0", gang=three_hosts)
    assert refused.status_code == 422, refused.content
    assert refused.json()["code"] == "never_fits"
    two_hosts = {"name": "pair", "size": 2, "topology": "spread_hosts"}
    assert submit(client, "pair-0", gang=two_hosts).status_code == 201
    assert not Job.objects.filter(name="wide-0").exists()
