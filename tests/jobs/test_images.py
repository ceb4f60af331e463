"""POST /jobs and its image: a tag is pinned to the registry's digest at submit; an image that
is missing, from elsewhere, for another architecture or (sensitive pools) unsigned is refused
with 422 and its reason code, and nothing is stored."""

import pytest

from config.builders import (
    TEST_IMAGE_TAG,
    build_node,
    build_pool,
    build_trusted_key,
    pinned_test_image,
    submit_job,
)
from jobs.models import Job
from leases.explain import NeverFits
from leases.models import Lease
from pools.models import AllowedRegistry, ResourceShape
from scheduling.passes import scheduling_pass
from tests.pools import registry_helpers as reg


def submit(client, image, **overrides):
    body = {"tenant": "vision", "pool": "test", "name": "train", "shape": "cpu-small"}
    body |= {"image": image, "command": ["echo", "hi"]} | overrides
    body = {key: value for key, value in body.items() if value is not None}
    return client.post("/api/v1/jobs/", body, format="json")


def refused(response, code):
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == code
    assert not Job.objects.exists() and not Lease.objects.exists()
    return response.json()["detail"]


def test_a_tag_is_stored_as_the_registrys_digest(api, member, cpu_shape):
    _, digest = reg.get_manifest(reg.SOURCE_REPO, reg.SOURCE_TAG)
    response = submit(api(member), TEST_IMAGE_TAG)
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["image"] == f"127.0.0.1:5000/computepool/busybox@{digest}" == pinned_test_image()
    assert job["image_requested"] == TEST_IMAGE_TAG
    assert Job.objects.get().image == job["image"]


def test_a_digest_that_exists_is_kept(api, member, cpu_shape):
    response = submit(api(member), pinned_test_image())
    assert response.status_code == 201, response.json()
    assert response.json()["image"] == response.json()["image_requested"] == pinned_test_image()


def test_a_tag_is_accepted_where_the_registry_asks_for_digests(api, member, cpu_shape):
    # require_digest (the default) no longer refuses tags: the job stores the digest only.
    assert AllowedRegistry.objects.get(pool=cpu_shape.pool).require_digest
    assert submit(api(member), TEST_IMAGE_TAG).status_code == 201


@pytest.mark.parametrize(
    "image",
    [
        "127.0.0.1:5000/computepool/busybox:no-such-tag",
        "127.0.0.1:5000/computepool/busybox@sha256:" + "a" * 64,
        "127.0.0.1:5000/computepool/nothing-here:test",
    ],
)
def test_an_image_the_registry_does_not_have_is_invalid(api, member, cpu_shape, image):
    assert "does not exist in registry 127.0.0.1:5000" in refused(
        submit(api(member), image), "image_invalid"
    )


def test_an_unparsable_reference_is_a_field_error(api, member, cpu_shape):
    response = submit(api(member), "127.0.0.1:5000/computepool/BusyBox:1")
    assert response.status_code == 400  # syntax, like every other field (tests/security)
    assert "not a valid repository path component" in response.json()["image"][0]


@pytest.mark.parametrize(
    "image",
    ["docker.io/library/busybox:latest", "busybox", "127.0.0.1:5000/elsewhere/busybox:test"],
)
def test_an_image_from_a_registry_the_pool_does_not_allow(api, member, cpu_shape, image):
    detail = refused(submit(api(member), image), "image_not_allowed")
    assert "not from an allowed registry of pool test (127.0.0.1:5000/computepool/)" in detail


def test_the_architecture_must_match_the_request(api, member, pool):
    resources = {"cpu_millicores_min": 500, "memory_mib_min": 256, "architecture": "arm64"}
    response = submit(api(member), TEST_IMAGE_TAG, shape=None, resources=resources)
    detail = refused(response, "image_invalid")
    assert detail.endswith("is built for linux/amd64, the job asks for linux/arm64")


def test_an_image_built_for_the_requested_architecture_is_accepted(api, member, pool):
    repository = reg.new_repository("arm")
    digest = reg.push_image_for(repository, "arm64", tag="v1")
    resources = {"cpu_millicores_min": 500, "memory_mib_min": 256, "architecture": "arm64"}
    response = submit(
        api(member), f"{reg.REGISTRY}/{repository}:v1", shape=None, resources=resources
    )
    assert response.status_code == 201, response.json()
    assert response.json()["image"] == f"{reg.REGISTRY}/{repository}@{digest}"


@pytest.fixture
def sensitive(db):
    """A sensitive pool with a shape and one trusted key; (pool, the key's private half)."""
    pool = build_pool("test", sensitive=True)
    ResourceShape.objects.create(
        pool=pool, name="cpu-small", cpu_millicores_min=1000, memory_mib_min=1024
    )
    key = reg.new_ecdsa_key()
    build_trusted_key(pool, reg.public_pem(key))
    return pool, key


@pytest.fixture
def image():
    """The busybox test image copied into a fresh repository: (repository, digest)."""
    repository = reg.new_repository("signed")
    return repository, reg.copy_test_image(repository)


def reference(image):
    return f"{reg.REGISTRY}/{image[0]}:v1"


def test_a_sensitive_pool_accepts_an_image_signed_by_its_key(api, member, sensitive, image):
    reg.push_signature(*image, sensitive[1])
    response = submit(api(member), reference(image))
    assert response.status_code == 201, response.json()
    assert response.json()["image"] == f"{reg.REGISTRY}/{image[0]}@{image[1]}"


def test_a_sensitive_pool_refuses_an_unsigned_image(api, member, sensitive, image):
    detail = refused(submit(api(member), reference(image)), "image_signature_invalid")
    assert detail.startswith("pool test accepts only signed images: the image is not signed")


def test_a_sensitive_pool_refuses_a_signature_by_another_key(api, member, sensitive, image):
    reg.push_signature(*image, reg.new_ecdsa_key())
    refused(submit(api(member), reference(image)), "image_signature_invalid")


def test_a_sensitive_pool_refuses_a_signature_of_another_digest(api, member, sensitive, image):
    reg.push_signature(*image, sensitive[1], signed_digest="sha256:" + "2" * 64)
    detail = refused(submit(api(member), reference(image)), "image_signature_invalid")
    assert "for another digest" in detail


def test_an_ordinary_pool_does_not_ask_for_signatures(api, member, cpu_shape, image):
    assert submit(api(member), reference(image)).status_code == 201


# --- the image's platforms, stored at submit, decide where the job may run -----------------


def test_an_amd64_image_runs_only_on_amd64_nodes(api, member, cpu_shape):
    # the arm64 node is the roomier one: without the platforms it would be chosen
    build_node(cpu_shape.pool, "arm", cpu=64000, memory=262144, architecture="arm64")
    build_node(cpu_shape.pool, "amd", cpu=4000, memory=8192, architecture="amd64")
    client = api(member)
    jobs = [submit(client, TEST_IMAGE_TAG).json() for _ in range(3)]
    assert all(job["image_platforms"] == ["linux/amd64"] for job in jobs)
    assert sorted(scheduling_pass().placed) == sorted(job["id"] for job in jobs)
    assert {lease.node.name for lease in Lease.objects.all()} == {"amd"}


def test_an_arm64_image_is_stored_with_its_platform_and_runs_on_arm64(api, member, pool):
    build_node(pool, "amd", cpu=64000, memory=262144, architecture="amd64")
    build_node(pool, "arm", cpu=4000, memory=8192, architecture="arm64")
    repository = reg.new_repository("arm")
    reg.push_image_for(repository, "arm64", tag="v1")
    resources = {"cpu_millicores_min": 500, "memory_mib_min": 256, "architecture": "arm64"}
    job = submit(api(member), f"{reg.REGISTRY}/{repository}:v1", shape=None, resources=resources)
    assert job.json()["image_platforms"] == ["linux/arm64"]
    assert scheduling_pass().placed == [job.json()["id"]]
    assert Lease.objects.get().node.name == "arm"


# A request that names no architecture (a service's, or one stored before requests had one):
# the image's platforms alone keep the job off nodes it cannot run on (the core's image_arch).
AMD64_ONLY = {"image_platforms": ["linux/amd64"]}


def test_without_a_requested_architecture_the_images_platforms_decide(pool, tenant):
    build_node(pool, "arm", cpu=64000, memory=262144, architecture="arm64")
    build_node(pool, "amd", cpu=4000, memory=8192, architecture="amd64")
    jobs = [submit_job(pool, tenant, **AMD64_ONLY) for _ in range(3)]
    assert "architecture" not in jobs[0].resources
    assert sorted(scheduling_pass().placed) == sorted(job.pk for job in jobs)
    assert {lease.node.name for lease in Lease.objects.all()} == {"amd"}


def test_an_amd64_image_never_fits_a_pool_of_arm64_nodes(pool, tenant):
    build_node(pool, "arm", cpu=64000, memory=262144, architecture="arm64")
    with pytest.raises(NeverFits) as refused_:
        submit_job(pool, tenant, **AMD64_ONLY)
    assert refused_.value.explanation["reasons"] == {"image_arch_incompatible": 1}
    assert not Job.objects.exists()


def test_it_waits_while_the_only_amd64_node_is_not_ready(pool, tenant):
    build_node(pool, "arm", cpu=64000, memory=262144, architecture="arm64")
    build_node(pool, "amd", architecture="amd64", ready=False)  # could run it, not yet
    job = submit_job(pool, tenant, **AMD64_ONLY)
    assert scheduling_pass().placed == []
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.pending_reason["reasons"]["image_arch_incompatible"] == 1
