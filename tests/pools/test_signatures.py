"""cosign signatures, pushed to the real loopback registry and verified offline with the keys a
pool trusts."""

import pytest

from pools.signatures import SignatureInvalid, signature_tag, verify_image_signature
from tests.pools import registry_helpers as reg


@pytest.fixture
def image():
    """A fresh repository holding the busybox test image: (repository, digest)."""
    repository = reg.new_repository("signed")
    return repository, reg.copy_test_image(repository)


def verify(image, *private_keys, pems=()):
    repository, digest = image
    keys = [reg.public_pem(key) for key in private_keys] + list(pems)
    verify_image_signature(reg.REGISTRY, repository, digest, keys)


def test_the_signature_tag_is_cosigns():
    assert signature_tag("sha256:" + "ab" * 32) == "sha256-" + "ab" * 32 + ".sig"


@pytest.mark.parametrize("new_key", [reg.new_ecdsa_key, reg.new_ed25519_key])
def test_an_image_signed_by_a_trusted_key_verifies(image, new_key):
    key = new_key()
    reg.push_signature(*image, key)
    verify(image, reg.new_ecdsa_key(), key)  # any one trusted key will do


def test_a_signature_by_another_key_is_refused(image):
    reg.push_signature(*image, reg.new_ecdsa_key())
    with pytest.raises(SignatureInvalid, match="none of the image's 1 signature"):
        verify(image, reg.new_ecdsa_key(), reg.new_ed25519_key())


def test_an_unsigned_image_is_refused(image):
    with pytest.raises(SignatureInvalid, match="the image is not signed"):
        verify(image, reg.new_ecdsa_key())


def test_a_genuine_signature_of_another_digest_is_refused(image):
    """Copying a signature manifest next to another image must not make that image signed."""
    key = reg.new_ecdsa_key()
    reg.push_signature(*image, key, signed_digest="sha256:" + "1" * 64)
    with pytest.raises(SignatureInvalid, match="for another digest"):
        verify(image, key)


def test_a_pool_without_a_usable_key_accepts_nothing(image):
    key = reg.new_ecdsa_key()
    reg.push_signature(*image, key)
    with pytest.raises(SignatureInvalid, match="trusts no"):
        verify(image, pems=["-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----"])
    verify(image, key, pems=["garbage"])  # a malformed key next to a good one is skipped
