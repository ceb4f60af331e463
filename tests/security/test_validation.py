"""Issue 9, area A1: values in requests — resource shapes, jobs, policy versions, images.

Every malformed value is refused at the door with a field error (400), through the real API and
the Django admin, so nothing the scheduler cannot handle is ever stored.
"""

import pytest

from config.builders import TEST_IMAGE_TAG
from jobs.models import Job
from leases.models import Lease
from pools.images import ImageRef, parse_image_reference
from pools.models import AllowedRegistry, ResourceShape
from tests.pools import registry_helpers as reg

DIGEST = "sha256:" + "a" * 64  # syntax only: the registry has no such manifest
IMAGE = TEST_IMAGE_TAG  # resolved to its real digest at submit
LEASES = "/api/v1/compute-leases"
JOBS = "/api/v1/jobs/"
GOOD_RESOURCES = {"cpu_millicores_min": 500, "memory_mib_min": 256}


def job_body(**overrides):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "resources": GOOD_RESOURCES,
        "image": IMAGE,
        "command": ["echo", "hi"],
    } | overrides
    return {key: value for key, value in body.items() if value is not None}


def lease_body(**overrides):
    body = {"pool": "test", "tenant": "vision", "resources": GOOD_RESOURCES, "duration_s": 300}
    return body | overrides


# ----------------------------------------------------------------- resource shapes (item 1, 2)

BAD_RESOURCES = [
    ({"regions": 5}, "regions"),
    ({"regions": True}, "regions"),
    ({"regions": [{"x": 1}]}, "regions"),
    ({"regions": "eu"}, "regions"),  # a string is not a list (it would match by substring)
    ({"gpu_models": [["A100"]]}, "gpu_models"),
    ({"gpu_models": 5}, "gpu_models"),
    ({"gpu_models": ["x" * 65]}, "gpu_models"),
    ({"zones": [""]}, "zones"),
    ({"zones": ["eu-1\x07a"]}, "zones"),
    ({"zones": [f"z{i}" for i in range(33)]}, "zones"),
    ({"gpu_count": 65, "gpu_sharing_class": "exclusive"}, "gpu_count"),
    ({"memory_mib_min": 2**31}, "memory_mib_min"),
    ({"scratch_mib": 2**31}, "scratch_mib"),
    ({"cpu_millicores_min": "lots"}, "cpu_millicores_min"),
    ({"node_pin": "n" * 101}, "node_pin"),
    ({"cpu_cores": 4}, "cpu_cores"),  # an unknown key (a typo) is named, not ignored
]


@pytest.mark.parametrize(("extra", "field"), BAD_RESOURCES)
def test_bad_inline_resources_are_refused_on_job_submit(api, member, pool, extra, field):
    response = api(member).post(JOBS, job_body(resources=GOOD_RESOURCES | extra), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["resources"]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(("extra", "field"), BAD_RESOURCES)
def test_bad_inline_resources_are_refused_on_compute_leases(api, member, ready_node, extra, field):
    response = api(member).post(LEASES, lease_body(resources=GOOD_RESOURCES | extra), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["resources"]
    assert Lease.objects.count() == 0


def test_bounded_string_lists_are_accepted(api, member, pool):
    resources = GOOD_RESOURCES | {
        "gpu_models": [],
        "regions": ["eu-west"],
        "zones": [f"eu-west-{i}" for i in range(32)],
        "node_pin": "n" * 100,
    }
    response = api(member).post(JOBS, job_body(resources=resources), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["resources"]["regions"] == ["eu-west"]


def test_the_admin_refuses_a_shape_with_a_malformed_list(client, shape_admin, pool):
    client.force_login(shape_admin)
    form = {
        "pool": pool.pk,
        "name": "bad",
        "cpu_millicores_min": 1000,
        "memory_mib_min": 1024,
        "gpu_count": 0,
        "gpu_models": "[]",
        "gpu_memory_mib_min": 0,
        "gpu_sharing_class": "none",
        "gpu_milli": 0,
        "scratch_mib": 0,
        "architecture": "amd64",
        "os": "linux",
        "container_runtime": "docker",
        "regions": "5",
        "zones": '[["a"]]',
        "regions_preferred": "[]",
        "zones_preferred": "[]",
        "trust_level_min": 0,
    }
    response = client.post("/admin/pools/resourceshape/add/", form)
    assert response.status_code == 200  # the form again, with its errors
    errors = response.context["adminform"].form.errors
    assert "regions" in errors and "zones" in errors
    assert not ResourceShape.objects.filter(name="bad").exists()
    form.update(regions='["eu-west"]', zones="[]")
    assert client.post("/admin/pools/resourceshape/add/", form).status_code == 302


# ----------------------------------------------------------------- unknown top-level fields


def test_unknown_top_level_fields_are_refused(api, member, ready_node):
    response = api(member).post(JOBS, job_body(priority="high"), format="json")
    assert response.status_code == 400 and "priority" in response.json()
    response = api(member).post(LEASES, lease_body(duraton_s=60), format="json")
    assert response.status_code == 400 and "duraton_s" in response.json()
    assert Job.objects.count() == 0 and Lease.objects.count() == 0


# ----------------------------------------------------------------- job strings and env (item 3)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"name": "n" * 101}, "name"),
        ({"command": ["x"] * 257}, "command"),
        ({"command": ["x" * 4097]}, "command"),
        ({"env": {f"K{i}": "v" for i in range(129)}}, "env"),
        ({"env": {"1BAD": "v"}}, "env"),
        ({"env": {"BAD-KEY": "v"}}, "env"),
        ({"env": {"K" * 129: "v"}}, "env"),
        ({"env": {"K": "v" * 4097}}, "env"),
    ],
)
def test_job_strings_and_env_have_limits(api, member, pool, extra, field):
    response = api(member).post(JOBS, job_body(**extra), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()
    assert Job.objects.count() == 0


def test_job_strings_and_env_at_their_limits_are_accepted(api, member, pool):
    # Each limit at its value (all at once would pass the 1 MiB request body limit).
    body = job_body(
        command=["x" * 4096] + ["x"] * 255,
        env={f"_K{i}": "v" for i in range(126)} | {"K" * 128: "v", "V": "v" * 4096},
    )
    response = api(member).post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()


# ----------------------------------------------------------------- policy versions (item 4)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"weights": {"bin_pack": 1}, "knobs": {"reservation_max_horizon_s": "abc"}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"reservation_max_hold_s": -5}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"reservation_max_tolerance_s": True}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"reservation_max_horizon_s": 10**12}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"drain_noncheckpointable": "maybe"}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"no_such_knob": 1}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"preemption_min_runtime_s": -1}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"credit_rates": {"default": {"gpu": 1}}}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"credit_rates": {"x": {"gpu_hour": -2}}}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"credit_rates": [1]}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"required_runtime": "runc"}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"required_runtime": "process"}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"required_runtime": True}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"short_job_share": 1.5}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": {"fair_share_half_life_s": "1h"}}, "knobs"),
        ({"weights": {"bin_pack": 1}, "knobs": [1, 2]}, "knobs"),
        ({"weights": {"no_such_scorer": 1}}, "weights"),
        ({"weights": {"bin_pack": "1"}}, "weights"),
        ({"weights": {"bin_pack": True}}, "weights"),
        ({"weights": {"bin_pack": 10**13}}, "weights"),
        ({"weights": {"bin_pack": -1}}, "weights"),
        ({"weights": {"binpack": 0.2}}, "weights"),  # the scorer is bin_pack
        ({"weights": {}}, "weights"),
        ({"weights": [1]}, "weights"),
    ],
)
def test_policy_knobs_and_weights_are_validated_on_publish(api, policy_admin, pool, body, field):
    url = f"/api/v1/pools/{pool.slug}/policy-versions/"
    response = api(policy_admin).post(url, body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()
    assert pool.scheduling_policy.versions.count() == 1


def test_valid_knobs_and_weights_publish_and_reservations_still_work(
    api, policy_admin, member, ready_node
):
    url = "/api/v1/pools/test/policy-versions/"
    body = {
        "weights": {"bin_pack": 1, "fragmentation": 0.5, "paper_fgd": 1e6},
        "knobs": {
            "reservation_max_horizon_s": 86400,
            "drain_noncheckpointable": "wait",
            "preemption_min_runtime_s": 0,
            "fair_share_half_life_s": 7200,
            "short_job_share": 0.2,
            "credit_rates": {"default": {"gpu_hour": 20, "consumed_factor": 0.5}},
        },
    }
    response = api(policy_admin).post(url, body, format="json")
    assert response.status_code == 201, response.json()
    response = api(member).post(LEASES, lease_body(), format="json")
    assert response.status_code == 201, response.json()


def test_the_admin_refuses_a_knob_of_the_wrong_type(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    form = {
        "policy": policy.pk,
        "weights": '{"bin_pack": 1}',
        "knobs": '{"reservation_max_horizon_s": "abc"}',
        "comment": "oops",
    }
    response = client.post("/admin/pools/schedulingpolicyversion/add/", form)
    assert response.status_code == 200
    assert "knobs" in response.context["adminform"].form.errors
    assert policy.versions.count() == 1


# ----------------------------------------------------------------- image references (item 5)


def test_image_references_are_parsed_into_components():
    ref = parse_image_reference(f"127.0.0.1:5000/computepool/team/busybox:1.36@{DIGEST}")
    assert ref == ImageRef("127.0.0.1:5000", "computepool/team/busybox", "1.36", DIGEST)
    assert parse_image_reference("busybox") == ImageRef("docker.io", "library/busybox", "", "")
    assert parse_image_reference("localhost/x:1").registry == "localhost"


@pytest.mark.parametrize(
    "image",
    [
        f"127.0.0.1:5000/computepool/../evil@{DIGEST}",
        "127.0.0.1:5000/computepool/x@sha256:abc",
        f"127.0.0.1:5000/computepool/x@sha256:{'a' * 65}",
        f"127.0.0.1:5000/computepool/x@sha256:{'g' * 64}",
        f"127.0.0.1:5000/computepool/x@md5:{'a' * 64}",
        f"127.0.0.1:5000/computepool/x y@{DIGEST}",
        f"127.0.0.1:5000/computepool/x\n@{DIGEST}",
        f"127.0.0.1:5000/computepool/x@{DIGEST}\n",
        f"127.0.0.1:5000/computepool/x#y@{DIGEST}",
        f"127.0.0.1:5000/computepool/X@{DIGEST}",
        f"127.0.0.1:5000/computepool//x@{DIGEST}",
        f"127.0.0.1:5000/computepool/x:@{DIGEST}",
        f"evil.example/127.0.0.1:5000/computepool/x@{DIGEST}",  # a host is no path component
        "",
    ],
)
def test_malformed_image_references_are_refused(api, member, pool, image):
    with pytest.raises(ValueError):
        parse_image_reference(image)
    response = api(member).post(JOBS, job_body(image=image), format="json")
    assert response.status_code == 400 and "image" in response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "image",
    [
        f"127.0.0.1:5000/computepoolevil/x@{DIGEST}",  # a prefix matches at a path boundary
        f"127.0.0.1:50001/computepool/x@{DIGEST}",
        f"evil.example/computepool/x@{DIGEST}",
    ],
)
def test_images_outside_an_allowed_registry_are_refused(api, member, pool, image):
    response = api(member).post(JOBS, job_body(image=image), format="json")
    assert response.status_code == 422 and response.json()["code"] == "image_not_allowed"
    assert Job.objects.count() == 0


def test_images_inside_an_allowed_registry_are_accepted(api, member, pool):
    client = api(member)
    digest = reg.copy_test_image("computepool/team/my_app.v2", tag="1.0-rc1")
    for image in (IMAGE, f"127.0.0.1:5000/computepool/team/my_app.v2:1.0-rc1@{digest}"):
        response = client.post(JOBS, job_body(image=image), format="json")
        assert response.status_code == 201, response.json()
    # A prefix without the trailing slash, or a whole registry, admits the same way.
    AllowedRegistry.objects.filter(pool=pool).update(prefix="127.0.0.1:5000/computepool")
    assert client.post(JOBS, job_body(), format="json").status_code == 201
    evil = f"127.0.0.1:5000/computepoolevil/x@{DIGEST}"
    assert client.post(JOBS, job_body(image=evil), format="json").status_code == 422
    AllowedRegistry.objects.filter(pool=pool).update(prefix="127.0.0.1:5000/")
    assert client.post(JOBS, job_body(), format="json").status_code == 201


def test_the_admin_refuses_an_unknown_scorer(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    form = {"policy": policy.pk, "weights": '{"binpack": 1}', "knobs": "{}", "comment": "oops"}
    response = client.post("/admin/pools/schedulingpolicyversion/add/", form)
    assert response.status_code == 200
    assert "weights" in response.context["adminform"].form.errors
    assert policy.versions.count() == 1
