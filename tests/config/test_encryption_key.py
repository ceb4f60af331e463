"""`manage.py encryption_key`: a new ring entry, and the ring `make run` writes once (0600) when
none is configured, read back by the settings' parser and never overwritten."""

import environ
import pytest
from django.core.management import call_command
from django.test import override_settings

from pools import encryption


def test_init_file_writes_a_ring_once_with_mode_0600(tmp_path, capsys):
    path = tmp_path / "var" / "encryption-keys"
    with override_settings(ENCRYPTION_KEYS={}, ENCRYPTION_KEYS_FILE=path):
        call_command("encryption_key", "--init-file")
        first = path.read_text()
        assert path.stat().st_mode & 0o777 == 0o600
        ring = environ.Env.parse_value(first.strip(), dict)  # as config/settings.py reads it
        assert len(encryption.parse_keyring(ring)) == 1
        with pytest.raises(FileExistsError):  # an unread or broken ring is never replaced
            call_command("encryption_key", "--init-file")
    with override_settings(ENCRYPTION_KEYS=ring, ENCRYPTION_KEYS_FILE=path):
        call_command("encryption_key", "--init-file")  # configured: nothing to do
    assert path.read_text() == first


def test_a_printed_entry_is_a_valid_ring(capsys):
    call_command("encryption_key")
    entry = capsys.readouterr().out.strip()
    assert encryption.parse_keyring(environ.Env.parse_value(entry, dict))
