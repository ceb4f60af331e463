"""Outputs at rest in the control plane's storage, encrypted per tenant (docs/storage.md,
"Encryption at rest and retention").

Envelope encryption: each tenant has a 256-bit data key (`TenantDataKey`), made on first need
and kept wrapped by the key ring (`pools/encryption.py`, the ring of the tenants' secrets too;
the GCM associated data names the tenant, so a wrapped key copied onto another tenant's row does
not open). Rotating the ring re-wraps the data keys (`manage.py reencrypt_secrets`); the files
are never rewritten.

A stored file is a header, then the plaintext in chunks each sealed with AES-256-GCM:

    header  = b"CPOE" | version (1 byte, 1) | data key id (8 bytes) | chunk size (4 bytes)
              | nonce prefix (8 random bytes)                            (big-endian, 25 bytes)
    chunk i = AES-256-GCM(data key, nonce = prefix | i (4 bytes),
                          plaintext[i * size : (i + 1) * size],
                          associated data = header | i (8 bytes) | final (1 byte))

Every file has at least one chunk (an empty output: one empty final chunk). Binding the index
and the final flag (and the header) into each chunk's tag makes a truncated file (cut at a
chunk boundary, the last chunk then not marked final), reordered or swapped chunks, a chunk of
another file, or an altered header fail to decrypt. Encryption and decryption stream: at most
two chunks of plaintext and one of ciphertext are in memory, whatever the file's size.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.db import IntegrityError, transaction
from django.utils import timezone

from pools import encryption

from .models import TenantDataKey

MAGIC = b"CPOE"
VERSION = 1
CHUNK_BYTES = 1024 * 1024
MAX_CHUNK_BYTES = 64 * 1024 * 1024  # what a header may claim: never a buffer of any size
TAG_BYTES = 16
PREFIX_BYTES = 8
HEADER = struct.Struct(">4sBQI8s")
CHUNK_AD = struct.Struct(">QB")
MAX_CHUNKS = 2**32  # the counter's 4 bytes of the nonce


class OutputUnreadable(Exception):
    """A stored output that does not decrypt: not one of ours, its data key not the tenant's or
    gone, altered, truncated or reordered. The message names the output's storage key only."""


def _wrap_context(tenant_id: int) -> str:
    return f"jobs.TenantDataKey tenant={tenant_id}"


def data_key_for(tenant_id: int) -> TenantDataKey:
    """The tenant's active data key, made (and wrapped under the ring's current key) when it
    has none: two processes making the first at once agree on one (the unique active key)."""
    key = TenantDataKey.objects.filter(tenant_id=tenant_id, active=True).first()
    if key is not None:
        return key
    raw = AESGCM.generate_key(bit_length=256)
    key_id, wrapped = encryption.encrypt(
        base64.b64encode(raw).decode(), context=_wrap_context(tenant_id)
    )
    try:
        with transaction.atomic():
            return TenantDataKey.objects.create(tenant_id=tenant_id, key_id=key_id, wrapped=wrapped)
    except IntegrityError:  # another process made it first
        return TenantDataKey.objects.get(tenant_id=tenant_id, active=True)


def unwrap(key: TenantDataKey) -> AESGCM:
    """The data key, opened by the key ring (an EncryptionError naming the ring's key when the
    ring no longer holds it)."""
    encoded = encryption.decrypt(key.key_id, key.wrapped, context=_wrap_context(key.tenant_id))
    try:
        return AESGCM(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError) as error:
        raise encryption.EncryptionError(f"data key {key.pk} is malformed") from error


def data_keys_rewrap() -> int:
    """Re-wraps every data key not wrapped under the ring's current key (key rotation, beside
    the secrets: `manage.py reencrypt_secrets`); how many. Each key under its own row lock. The
    outputs sealed under them are untouched: their data keys do not change."""
    current = encryption.current_key_id()
    done = 0
    for pk in TenantDataKey.objects.exclude(key_id=current).values_list("pk", flat=True):
        with transaction.atomic():
            key = TenantDataKey.objects.select_for_update().filter(pk=pk).first()
            if key is None or key.key_id == current:
                continue
            context = _wrap_context(key.tenant_id)
            plain = encryption.decrypt(key.key_id, key.wrapped, context=context)
            key.key_id, key.wrapped = encryption.encrypt(plain, context=context)
            key.rewrapped_at = timezone.now()
            key.save(update_fields=["key_id", "wrapped", "rewrapped_at"])
            done += 1
    return done


def _read_full(source, size: int) -> bytes:
    """Up to `size` bytes of `source`, fewer only at its end (a stream may return short reads)."""
    parts, got = [], 0
    while got < size:
        part = source.read(size - got)
        if not part:
            break
        if isinstance(part, str):
            part = part.encode()
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class EncryptingReader(io.RawIOBase):
    """Reads `source` (plaintext) and gives the sealed file, chunk by chunk: what a storage's
    `save` reads (through `read` or Django's `File.chunks`). `on_plaintext(chunk)` sees every
    plaintext chunk first (hashing, counting, the size limit: what it raises stops the save)."""

    def __init__(self, source, *, key: TenantDataKey, on_plaintext=None, chunk_size=CHUNK_BYTES):
        super().__init__()
        self._source = source
        self._aead = unwrap(key)
        self._on_plaintext = on_plaintext
        self._chunk_size = chunk_size
        self._header = HEADER.pack(MAGIC, VERSION, key.pk, chunk_size, os.urandom(PREFIX_BYTES))
        self._prefix = self._header[-PREFIX_BYTES:]
        self._pending = memoryview(self._header)
        self._index = 0
        self._next = self._plain()
        self._done = False

    def _plain(self) -> bytes:
        chunk = _read_full(self._source, self._chunk_size)
        if chunk and self._on_plaintext is not None:
            self._on_plaintext(chunk)
        return chunk

    def _seal_next(self) -> bytes:
        plain = self._next
        self._next = self._plain() if len(plain) == self._chunk_size else b""
        final = not self._next
        if self._index >= MAX_CHUNKS:
            raise ValueError("an output of more than 2**32 chunks")
        nonce = self._prefix + struct.pack(">I", self._index)
        sealed = self._aead.encrypt(nonce, plain, self._header + CHUNK_AD.pack(self._index, final))
        self._index += 1
        self._done = final
        return sealed

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self._pending:
            if self._done:
                return 0
            self._pending = memoryview(self._seal_next())
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def sealed_key_id(header: bytes) -> int:
    """The data key id a sealed file's header names (OutputUnreadable if it is not a header)."""
    if len(header) != HEADER.size:
        raise OutputUnreadable("not a sealed output (too short)")
    magic, version, key_pk, chunk_size, _ = HEADER.unpack(header)
    if magic != MAGIC or version != VERSION:
        raise OutputUnreadable("not a sealed output of a known version")
    if not 0 < chunk_size <= MAX_CHUNK_BYTES:
        raise OutputUnreadable("a sealed output with an impossible chunk size")
    return key_pk


class DecryptingReader(io.RawIOBase):
    """The plaintext of a sealed file (`stored`, opened for reading), chunk by chunk. The header
    and the first chunk are checked when it is made, so a file that does not open (wrong or
    missing key, altered header) is refused before anything is sent; a chunk altered further on
    raises OutputUnreadable when it is reached. `key` is the data key the output's row names:
    a header naming another is refused."""

    def __init__(self, stored, *, key: TenantDataKey):
        super().__init__()
        self._stored = stored
        self._header = _read_full(stored, HEADER.size)
        if sealed_key_id(self._header) != key.pk:
            raise OutputUnreadable("sealed under another data key than its row names")
        self._chunk_size = HEADER.unpack(self._header)[3]
        self._prefix = self._header[-PREFIX_BYTES:]
        self._aead = unwrap(key)
        self._index = 0
        self._done = False
        self._next = _read_full(stored, self._chunk_size + TAG_BYTES)
        self._pending = memoryview(self._open_next())

    def _open_next(self) -> bytes:
        sealed = self._next
        if len(sealed) < TAG_BYTES:
            raise OutputUnreadable("truncated")
        full = len(sealed) == self._chunk_size + TAG_BYTES
        self._next = _read_full(self._stored, self._chunk_size + TAG_BYTES) if full else b""
        final = not self._next
        nonce = self._prefix + struct.pack(">I", self._index)
        try:
            plain = self._aead.decrypt(
                nonce, sealed, self._header + CHUNK_AD.pack(self._index, final)
            )
        except InvalidTag:
            raise OutputUnreadable(
                f"chunk {self._index} does not decrypt (altered, truncated or reordered)"
            ) from None
        self._index += 1
        self._done = final
        return plain

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            if self._done:
                return 0
            self._pending = memoryview(self._open_next())
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        try:
            self._stored.close()
        finally:
            super().close()
