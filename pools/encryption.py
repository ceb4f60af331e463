"""The control plane's key ring: values kept encrypted at rest in the database (tenants'
secrets; the object-store credentials of the storage work will use it too).

`settings.ENCRYPTION_KEYS` maps a key id to a 256-bit AES key (URL-safe base64), the first
entry being the current key: the env form `ENCRYPTION_KEYS=2026b=<key>,2026a=<key>`, read by
django-environ as an ordered dict. Each value is sealed with AES-256-GCM under the current key
with a fresh 96-bit nonce and stored as `nonce || ciphertext+tag` beside the id of its key. The
caller names what a value belongs to (`context`, e.g. the secret's tenant and name): it is the
GCM associated data, so a sealed value copied onto another row does not open there.

Rotation: put a new key first, run `manage.py reencrypt_secrets` (every value re-sealed under
the current key), then drop the old key. A missing ring, an unknown key id or a value that does
not open is an `EncryptionError` naming the key: never a silent fallback to another key.
"""

from __future__ import annotations

import base64
import binascii
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")
KEY_BYTES = 32
NONCE_BYTES = 12


class EncryptionError(ImproperlyConfigured):
    """The key ring cannot seal or open a value (not configured, key gone, wrong key)."""


def parse_keyring(ring) -> dict[str, AESGCM]:
    """{key id: AESGCM}, in the ring's order (the first is current); malformed entries are an
    EncryptionError naming the entry (never the key)."""
    if not isinstance(ring, dict):
        raise EncryptionError("ENCRYPTION_KEYS is a mapping of key id to key.")
    keys = {}
    for key_id, encoded in ring.items():
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            raise EncryptionError(
                f"ENCRYPTION_KEYS: key id {str(key_id)[:40]!r} is not 1-32 letters, digits, "
                "'.', '_' or '-'."
            )
        try:
            raw = base64.urlsafe_b64decode(str(encoded).strip().encode())
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != KEY_BYTES:
            raise EncryptionError(
                f"ENCRYPTION_KEYS: key {key_id!r} is not {KEY_BYTES} bytes in URL-safe base64 "
                "(make one with `manage.py encryption_key`)."
            )
        keys[key_id] = AESGCM(raw)
    return keys


def keyring() -> dict[str, AESGCM]:
    keys = parse_keyring(getattr(settings, "ENCRYPTION_KEYS", None) or {})
    if not keys:
        raise EncryptionError(
            "ENCRYPTION_KEYS is not configured: values are encrypted at rest and there is no "
            "key (README, Configuration)."
        )
    return keys


def current_key_id() -> str:
    return next(iter(keyring()))


def new_key() -> str:
    """A fresh key in the ring's form."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def encrypt(plaintext: str, *, context: str) -> tuple[str, bytes]:
    """(the current key's id, nonce || ciphertext) of `plaintext` bound to `context`."""
    key_id, key = next(iter(keyring().items()))
    nonce = os.urandom(NONCE_BYTES)
    return key_id, nonce + key.encrypt(nonce, plaintext.encode(), context.encode())


def decrypt(key_id: str, sealed: bytes, *, context: str) -> str:
    key = keyring().get(key_id)
    if key is None:
        raise EncryptionError(
            f"A value ({context}) is encrypted under key {key_id!r}, which ENCRYPTION_KEYS does "
            "not hold (was it removed before `manage.py reencrypt_secrets` ran?)."
        )
    sealed = bytes(sealed)
    try:
        plain = key.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode())
    except InvalidTag:
        raise EncryptionError(
            f"A value ({context}) does not decrypt under key {key_id!r}: another key under the "
            "same id, or the stored value was altered."
        ) from None
    return plain.decode()


@checks.register(checks.Tags.security)
def check_keyring(app_configs=None, **kwargs) -> list:
    """A malformed ring is an error at start (`manage.py check`, every server start), not at the
    first secret; no ring at all is a deployment warning (`check --deploy`)."""
    ring = getattr(settings, "ENCRYPTION_KEYS", None) or {}
    try:
        parse_keyring(ring)
    except EncryptionError as error:
        return [checks.Error(str(error), id="pools.E001")]
    return []


@checks.register(checks.Tags.security, deploy=True)
def check_keyring_configured(app_configs=None, **kwargs) -> list:
    if getattr(settings, "ENCRYPTION_KEYS", None):
        return []
    return [
        checks.Warning(
            "ENCRYPTION_KEYS is not configured: tenants' secrets, registered buckets' "
            "credentials and jobs' outputs cannot be stored.",
            id="pools.W001",
        )
    ]
