"""The registry client against the real loopback registry: a tag resolves to the digest the
registry says, with the platforms the image is built for."""

import json
import re

import pytest

from pools.registry import Platform, RegistryError, base_url, fetch_blob, resolve
from tests.pools import registry_helpers as reg

AMD64 = Platform("linux", "amd64")


def test_a_tag_resolves_to_the_digest_the_registry_reports():
    _, registry_digest = reg.get_manifest(reg.SOURCE_REPO, reg.SOURCE_TAG)
    image = resolve(reg.REGISTRY, reg.SOURCE_REPO, reg.SOURCE_TAG)
    assert image.digest == registry_digest
    assert image.pinned == f"127.0.0.1:5000/computepool/busybox@{registry_digest}"
    assert image.platforms == (AMD64,)  # read from the image's config blob


def test_a_digest_resolves_to_itself():
    digest = resolve(reg.REGISTRY, reg.SOURCE_REPO, reg.SOURCE_TAG).digest
    assert resolve(reg.REGISTRY, reg.SOURCE_REPO, digest).digest == digest


def test_a_moved_tag_resolves_to_its_new_digest():
    repository = reg.new_repository("moved")
    first = reg.copy_test_image(repository, tag="latest")
    second = reg.push_image_for(repository, "arm64", tag="latest")
    image = resolve(reg.REGISTRY, repository, "latest")
    assert (image.digest, image.architectures) == (second, ("arm64",))
    assert first != second


def test_an_unknown_tag_or_repository_says_it_does_not_exist():
    with pytest.raises(RegistryError, match=re.escape("does not exist in registry 127.0.0.1:5000")):
        resolve(reg.REGISTRY, reg.SOURCE_REPO, "no-such-tag")
    with pytest.raises(RegistryError, match="does not exist"):
        resolve(reg.REGISTRY, "computepool/nothing-here", "test")
    with pytest.raises(RegistryError, match="does not exist"):
        resolve(reg.REGISTRY, reg.SOURCE_REPO, "sha256:" + "0" * 64)


def test_an_unreachable_registry_is_named(settings):
    settings.REGISTRY_INSECURE_HOSTS = ["127.0.0.1:9"]  # discard port: nothing listens
    with pytest.raises(RegistryError, match=re.escape("registry 127.0.0.1:9 could not be reached")):
        resolve("127.0.0.1:9", "computepool/busybox", "test")


def test_an_index_lists_its_platforms_without_attestations():
    repository = reg.new_repository("multi")
    amd = reg.copy_test_image(repository, tag="amd")
    arm = reg.push_image_for(repository, "arm64", tag="arm")
    index = reg.push_index(
        repository,
        "latest",
        [
            (amd, {"os": "linux", "architecture": "amd64"}),
            (arm, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            (arm, {"os": "unknown", "architecture": "unknown"}),  # as buildx's attestations
        ],
    )
    image = resolve(reg.REGISTRY, repository, "latest")
    assert image.digest == index  # the job runs the index; the engine picks its platform
    assert image.platforms == (AMD64, Platform("linux", "arm64", "v8"))


def test_blobs_are_checked_against_their_digest():
    body, _ = reg.get_manifest(reg.SOURCE_REPO, reg.SOURCE_TAG)
    config_digest = json.loads(body)["config"]["digest"]
    assert reg.digest_of(fetch_blob(reg.REGISTRY, reg.SOURCE_REPO, config_digest)) == (
        config_digest
    )
    with pytest.raises(RegistryError, match="not named by a sha256 digest"):
        fetch_blob(reg.REGISTRY, reg.SOURCE_REPO, "../../_catalog")


def test_only_the_configured_hosts_are_reached_over_plain_http(settings):
    assert base_url("127.0.0.1:5000") == "http://127.0.0.1:5000/v2/"
    assert base_url("localhost:5000") == "http://localhost:5000/v2/"
    assert base_url("registry.example.com") == "https://registry.example.com/v2/"
    assert base_url("127.0.0.1:5001") == "https://127.0.0.1:5001/v2/"
    settings.REGISTRY_INSECURE_HOSTS = ["registry.lan:5000"]
    assert base_url("registry.lan:5000") == "http://registry.lan:5000/v2/"
