"""The key ring's system checks: a malformed ring stops `manage.py check` (and every server
start); no ring at all is a deployment warning."""

from django.test import override_settings

from pools import encryption


def test_a_malformed_ring_is_an_error_and_a_good_one_passes():
    assert encryption.check_keyring() == []
    with override_settings(ENCRYPTION_KEYS={"k": "too-short"}):
        [error] = encryption.check_keyring()
    assert error.id == "pools.E001" and "32 bytes" in error.msg


def test_no_ring_is_a_deployment_warning():
    assert encryption.check_keyring_configured() == []
    with override_settings(ENCRYPTION_KEYS={}):
        [warning] = encryption.check_keyring_configured()
        assert encryption.check_keyring() == []  # empty is not malformed
    assert warning.id == "pools.W001"
