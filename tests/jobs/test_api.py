import pytest

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, pinned_test_image
from jobs.models import Job
from pools.models import ResourceShape
from pools.services import policy_version_publish

IMAGE = TEST_IMAGE_TAG  # the real test image (tests/jobs/test_images.py: how it is resolved)


def submit(client, **overrides):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "shape": "cpu-small",
        "image": IMAGE,
        "command": ["echo", "hi"],
    } | overrides
    body = {key: value for key, value in body.items() if value is not None}
    return client.post("/api/v1/jobs/", body, format="json")


def test_member_submits_by_shape_and_sees_the_event(api, member, cpu_shape):
    client = api(member)
    response = submit(client)
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["state"] == "queued" and job["resources"]["cpu_millicores_min"] == 1000
    events = client.get(f"/api/v1/jobs/{job['id']}/events/").json()
    assert [(e["from_state"], e["to_state"], e["reason"]) for e in events] == [
        ("", "queued", "submitted")
    ]
    assert events[0]["actor"] == "user:member"


def test_inline_resources_are_validated_by_field(api, member, pool):
    response = submit(
        api(member),
        shape=None,
        resources={
            "cpu_millicores_min": 500,
            "memory_mib_min": 256,
            "gpu_count": 1,
            "gpu_sharing_class": "timeslice",
            "gpu_milli": 1500,
        },
    )
    assert response.status_code == 400
    assert "gpu_milli" in response.json()["resources"]


def test_inline_resources_accepted(api, member, pool):
    response = submit(
        api(member),
        shape=None,
        resources={
            "cpu_millicores_min": 500,
            "memory_mib_min": 256,
            "gpu_count": 1,
            "gpu_sharing_class": "mps",
            "gpu_milli": 250,
        },
    )
    assert response.status_code == 201, response.json()
    assert response.json()["resources"]["gpu_sharing_class"] == "mps"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"shape": "no-such-shape"}, "shape"),
        ({"tenant": "nlp"}, "tenant"),
        ({"pool": "nope"}, "pool"),
        ({"image": "127.0.0.1:5000/computepool/Busybox:test"}, "image"),
        ({"priority_class": "nope"}, "priority_class"),
        ({"max_runtime_s": 0}, "max_runtime_s"),
    ],
)
def test_bad_submissions_get_field_errors(api, member, cpu_shape, body, field):
    response = submit(api(member), **body)
    assert response.status_code == 400
    assert field in response.json()
    assert Job.objects.count() == 0


def test_a_tag_is_submitted_and_the_digest_stored(api, member, cpu_shape):
    job = submit(api(member)).json()
    assert (job["image"], job["image_requested"]) == (pinned_test_image(), IMAGE)


def test_other_tenants_cannot_see_or_cancel(api, member, outsider, operator, cpu_shape):
    job_id = submit(api(member)).json()["id"]
    assert api(outsider).get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert api(outsider).post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert api(outsider).get("/api/v1/jobs/").json()["count"] == 0
    assert api(operator).get(f"/api/v1/jobs/{job_id}/").status_code == 200


def test_cancel_then_cancel_again_is_a_conflict(api, member, cpu_shape):
    client = api(member)
    job_id = submit(client).json()["id"]
    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert again.status_code == 409 and again.json()["code"] == "transition_not_allowed"


def test_malformed_json_is_a_400(api, member, cpu_shape):
    response = api(member).post("/api/v1/jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400


def test_events_are_cursor_paginated_with_a_next_link(api, member, cpu_shape):
    client = api(member)
    job_id = submit(client).json()["id"]
    client.post(f"/api/v1/jobs/{job_id}/cancel/")
    first = client.get(f"/api/v1/jobs/{job_id}/events", {"limit": 1})
    assert [e["reason"] for e in first.json()] == ["submitted"]
    next_url = first["Link"].split(";")[0].strip("<>")
    rest = client.get(next_url)
    assert [e["reason"] for e in rest.json()] == ["cancelled_by_user"]
    assert "Link" not in rest
    last_seen = rest.json()[-1]["id"]
    assert client.get(f"/api/v1/jobs/{job_id}/events", {"after": last_seen}).json() == []
    bad = client.get(f"/api/v1/jobs/{job_id}/events", {"after": "x", "limit": 0})
    assert bad.status_code == 400 and set(bad.json()) >= {"after"}
    beyond = client.get(f"/api/v1/jobs/{job_id}/events", {"after": 2**63})
    assert beyond.status_code == 400 and "after" in beyond.json()["errors"]


def test_explain_says_why_a_job_waits_and_what_the_scheduler_says_now(
    api, member, outsider, cpu_shape, ready_node
):
    client = api(member)
    job_id = submit(client).json()["id"]
    body = client.get(f"/api/v1/jobs/{job_id}/explain").json()
    assert body["job"] == job_id and body["state"] == "queued"
    assert body["now"]["fits_now"] is True and body["now"]["node"] == ready_node.name
    # another job holds the node's CPU: now the answer is why not, and when
    hog = {"cpu_millicores_min": 14000, "memory_mib_min": 64}
    held = client.post(
        "/api/v1/compute-leases/",
        {"tenant": "vision", "pool": "test", "resources": hog},
        format="json",
    )
    assert held.status_code == 201, held.content
    now = client.get(f"/api/v1/jobs/{job_id}/explain").json()["now"]
    assert now["fits_now"] is False and now["never_fits"] is False
    assert now["reasons"] == {"insufficient_cpu": 1}
    assert now["nearest_miss"]["after_leases"] == [str(held.json()["id"])]
    assert api(outsider).get(f"/api/v1/jobs/{job_id}/explain").status_code == 404
    assert client.get("/api/v1/jobs/abc/explain").status_code == 404


def require_runtime(pool, runtime):
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=pool.scheduling_policy,
        weights=dict(current.weights),
        knobs=dict(current.knobs or {}) | {"required_runtime": runtime},
        actor=SYSTEM,
    )


def test_a_pool_requiring_gvisor_refuses_weaker_runtimes_at_submit(api, member, pool, cpu_shape):
    build_node(pool, "runsc-1", cpu=16000, memory=65536, runtimes=["docker", "gvisor"])
    ResourceShape.objects.create(
        pool=pool,
        name="cpu-small-gvisor",
        cpu_millicores_min=1000,
        memory_mib_min=1024,
        container_runtime="gvisor",
    )
    require_runtime(pool, "gvisor")
    client = api(member)

    by_shape = submit(client)  # cpu-small: Docker
    assert by_shape.status_code == 400
    assert by_shape.json()["errors"]["shape"] == [
        "Pool test runs jobs under gvisor only (its required_runtime); this asks for docker."
    ]
    for inline in ({}, {"container_runtime": "docker"}, {"container_runtime": "process"}):
        resources = {"cpu_millicores_min": 500, "memory_mib_min": 256} | inline
        response = submit(client, shape=None, resources=resources)
        assert response.status_code == 400, response.json()
        assert "container_runtime" in response.json()["errors"]["resources"]
    assert Job.objects.count() == 0

    accepted = submit(client, shape="cpu-small-gvisor")
    assert accepted.status_code == 201, accepted.json()
    assert accepted.json()["resources"]["container_runtime"] == "gvisor"


def test_a_pool_requiring_docker_takes_gvisor_and_refuses_the_process_runtime(
    api, member, pool, cpu_shape
):
    build_node(pool, "runsc-1", cpu=16000, memory=65536, runtimes=["docker", "gvisor"])
    require_runtime(pool, "docker")
    client = api(member)
    assert submit(client).status_code == 201  # Docker itself
    inline = {"cpu_millicores_min": 500, "memory_mib_min": 256}
    stronger = submit(client, shape=None, resources=inline | {"container_runtime": "gvisor"})
    assert stronger.status_code == 201, stronger.json()
    weaker = submit(client, shape=None, resources=inline | {"container_runtime": "process"})
    assert weaker.status_code == 400 and "resources" in weaker.json()["errors"]


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"container_runtime": "runc"}, "container_runtime"),
        (
            {"container_runtime": "gvisor", "gpu_count": 1, "gpu_sharing_class": "exclusive"},
            "container_runtime",
        ),
    ],
)
def test_a_runtime_outside_the_catalogue_or_gvisor_with_gpus_is_a_field_error(
    api, member, pool, resources, field
):
    body = {"cpu_millicores_min": 500, "memory_mib_min": 256} | resources
    response = submit(api(member), shape=None, resources=body)
    assert response.status_code == 400
    assert field in response.json()["errors"]["resources"]


def test_no_gvisor_node_in_the_pool_is_a_422_at_submit(api, member, pool, ready_node):
    inline = {"cpu_millicores_min": 500, "memory_mib_min": 256, "container_runtime": "gvisor"}
    response = submit(api(member), shape=None, resources=inline)
    assert response.status_code == 422
    assert "runtime_unsupported" in response.json()["message"]


def publish_knobs(pool, **knobs):
    current = pool.scheduling_policy.current
    policy_version_publish(
        policy=pool.scheduling_policy,
        weights=dict(current.weights),
        knobs=dict(current.knobs or {}) | knobs,
        actor=SYSTEM,
    )


def test_the_output_limit_defaults_to_the_pools_knob_and_is_the_jobs_disk(
    api, member, cpu_shape, tenant
):
    from config.builders import build_node
    from leases.models import Lease
    from scheduling.passes import scheduling_pass

    node = build_node(cpu_shape.pool, "disk", cpu=16000, memory=65536, scratch=1000)
    client = api(member)
    # no knob: 1 GiB, more disk than the pool's only node has (422 never_fits)
    assert submit(client).json()["code"] == "never_fits"
    publish_knobs(cpu_shape.pool, output_limit_mib=300)
    inline = {"cpu_millicores_min": 100, "memory_mib_min": 64, "scratch_mib": 200}
    job = submit(client, shape=None, resources=inline).json()
    assert job["output_limit_mib"] == 300
    explicit = submit(client, output_limit_mib=400).json()
    assert explicit["output_limit_mib"] == 400
    waiting = submit(client).json()  # 300 more: the node's disk is 100 short once both run
    placed = scheduling_pass(pool_id=cpu_shape.pool.pk).placed
    assert sorted(placed) == sorted([job["id"], explicit["id"]])  # 500 + 400 of 1000 MiB
    assert waiting["id"] not in placed
    leases = {lease.job_id: lease.scratch_mib for lease in Lease.objects.all()}
    assert leases == {job["id"]: 500, explicit["id"]: 400}
    node.refresh_from_db()
    assert node.scratch_mib_reserved == 900  # scratch and /outputs, on the node's ledger


@pytest.mark.parametrize("value", [0, -1, 1024 * 1024 + 1, "big", True])
def test_a_bad_output_limit_is_a_field_error(api, member, cpu_shape, value):
    response = submit(api(member), output_limit_mib=value)
    assert response.status_code == 400 and "output_limit_mib" in response.json()["errors"]


def test_an_output_limit_above_the_storage_quota_left_is_400(api, member, cpu_shape, tenant):
    from pools.models import Quota

    Quota.objects.create(
        tenant=tenant,
        pool=cpu_shape.pool,
        cpu_millicores=10**6,
        memory_mib=10**7,
        gpus=100,
        storage_mib=100,
    )
    client = api(member)
    response = submit(client)  # the default 1024 MiB
    assert response.status_code == 400
    assert "output_limit_mib" in response.json()["errors"]
    assert "100 MiB left" in response.json()["errors"]["output_limit_mib"][0]
    assert submit(client, output_limit_mib=100).status_code == 201
    assert not Job.objects.filter(output_limit_mib=1024).exists()


def test_explain_says_why_the_last_pass_and_now_disagree(api, member, cpu_shape, ready_node):
    from scheduling.passes import scheduling_pass

    client = api(member)
    hog = {"cpu_millicores_min": 14000, "memory_mib_min": 64}
    held = client.post(
        "/api/v1/compute-leases/",
        {"tenant": "vision", "pool": "test", "resources": hog, "duration_s": 600},
        format="json",
    ).json()
    job_id = submit(client).json()["id"]
    assert scheduling_pass().placed == []  # no capacity at the pass
    body = client.get(f"/api/v1/jobs/{job_id}/explain").json()
    assert body["pending_reason"]["code"] == "no_capacity" and "differs" not in body
    # capacity frees after the pass: "now" fits, and the answer says why the two differ
    client.post(f"/api/v1/compute-leases/{held['id']}/release", {}, format="json")
    body = client.get(f"/api/v1/jobs/{job_id}/explain").json()
    assert body["now"]["fits_now"] is True
    assert body["differs"].startswith("capacity freed since the last pass")
    # a quota that leaves no room: the queue holds it although a node has room
    Job.objects.filter(pk=job_id).update(pending_reason={"code": "quota_exceeded"})
    body = client.get(f"/api/v1/jobs/{job_id}/explain").json()
    assert body["differs"] == "but its tenant's quota has no room for it"


def test_explain_of_a_job_in_a_reservation_names_it_and_searches_nothing(api, member, ready_node):
    from datetime import timedelta

    from django.utils import timezone

    client = api(member)
    start = timezone.now() + timedelta(hours=1)
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    resources = {"cpu_millicores_min": 2000, "memory_mib_min": 2048, "scratch_mib": 4096}
    held = client.post(
        "/api/v1/compute-leases/",
        {"tenant": "vision", "pool": "test", "resources": resources, "window": window},
        format="json",
    ).json()
    body = {"tenant": "vision", "pool": "test", "name": "r", "image": TEST_IMAGE_TAG}
    body |= {"resources": {"cpu_millicores_min": 500, "memory_mib_min": 256}}
    job = client.post("/api/v1/jobs/", body | {"reservation": held["id"]}, format="json").json()
    answer = client.get(f"/api/v1/jobs/{job['id']}/explain").json()
    assert answer["reservation"]["lease"] == held["id"] and "now" not in answer
