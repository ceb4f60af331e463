"""Checks a node's signed request (docs/security.md "Node identity"): HTTP Message Signatures
(RFC 9421, the `http-message-signatures` library) by the Ed25519 key bound to the node at
enrollment (worker_agent/identity.py signs).

A request is taken only when its signature labelled `node`:
- verifies under the node's bound public key, and names that key (`keyid` = the node's
  `identity_fingerprint`);
- covers the method, the path, the query, and `content-digest` (checked here against the body
  read) — or, for a streamed upload, `upload-digest` (the file's SHA-256, checked by the upload
  view against what it stored: `upload_digest`);
- was made at most SIGNATURE_MAX_AGE_S ago (and not more than SIGNATURE_SKEW_S ahead);
- carries a nonce never seen before: each is kept in Redis (the cache alias "nonces", which
  every web process shares) until its signature would be too old anyway. When Redis cannot be
  reached the request is refused with 503: without the store a replay could not be told apart.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core.cache import caches
from http_message_signatures import HTTPMessageVerifier, HTTPSignatureKeyResolver, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException
from rest_framework import exceptions, status

from worker_agent.identity import LABEL, TAG

REQUIRED = ("@method", "@path", "@query")
UPLOAD_DIGEST = "upload-digest"
SIGNATURE_MAX_AGE_S = 300
SIGNATURE_SKEW_S = 30
NONCE_MAX_CHARS = 100


class SignatureRefused(exceptions.AuthenticationFailed):
    """401 with the reason code `signature_refused` and what was wrong."""

    default_code = "signature_refused"


class NonceStoreUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "nonce_store_unavailable"
    default_detail = "Signed requests cannot be checked for replay now; try again."


def public_key_from(text: str) -> Ed25519PublicKey:
    """The Ed25519 public key of its base64 raw form (32 bytes); ValueError when it is not."""
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64") from exc
    if len(raw) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def fingerprint_of(text: str) -> str:
    """The SHA-256 (hex) of the raw public key: the node's identity and every signature's keyid."""
    return hashlib.sha256(base64.b64decode(str(text))).hexdigest()


class _OneKey(HTTPSignatureKeyResolver):
    def __init__(self, key_id: str, public_key: Ed25519PublicKey):
        self.key_id, self.public_key = key_id, public_key

    def resolve_public_key(self, key_id: str):
        if key_id != self.key_id:
            raise SignatureRefused("The signature names another key than the node's.")
        return self.public_key

    def resolve_private_key(self, key_id: str):  # pragma: no cover (never signs)
        raise NotImplementedError


def _message(request) -> SimpleNamespace:
    """The request as the library reads it: the path and query as the agent sent them (the
    host is not covered: a proxy in front may change it)."""
    return SimpleNamespace(
        method=request.method,
        url=f"http://control-plane{request.get_full_path()}",
        headers=request.headers,
    )


def verify(request, *, public_key: str, fingerprint: str) -> dict:
    """Checks the signature of `request` (a Django HttpRequest) under `public_key`; returns
    its parameters (created, nonce, keyid …) or raises SignatureRefused / NonceStoreUnavailable."""
    if "signature" not in request.headers or "signature-input" not in request.headers:
        raise SignatureRefused(
            "Node requests are signed by the node's key (Signature and Signature-Input)."
        )
    if not public_key or not fingerprint:
        raise SignatureRefused("No key is bound to this node: enroll it again.")
    try:
        key = public_key_from(public_key)
    except ValueError as exc:
        raise SignatureRefused("The node's bound key is unreadable.") from exc
    verifier = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519, key_resolver=_OneKey(fingerprint, key)
    )
    message = _message(request)
    upload = UPLOAD_DIGEST in request.headers
    try:
        results = verifier.verify(
            message,
            expect_label=LABEL,
            expect_tag=TAG,
            max_age=datetime.timedelta(seconds=SIGNATURE_MAX_AGE_S),
            require_components=REQUIRED + ((UPLOAD_DIGEST,) if upload else ()),
            body=None if upload else request.body,
        )
    except SignatureRefused:
        raise
    except HTTPMessageSignaturesException as exc:
        raise SignatureRefused(f"The signature does not verify: {str(exc)[:200]}") from exc
    params = results[0].parameters
    _check_time(params.get("created"))
    _claim_nonce(fingerprint, params.get("nonce"))
    return params


def _check_time(created) -> None:
    now = datetime.datetime.now(datetime.UTC).timestamp()
    if not isinstance(created, int) or created > now + SIGNATURE_SKEW_S:
        raise SignatureRefused("The signature's `created` is missing or in the future.")


def _claim_nonce(fingerprint: str, nonce) -> None:
    if not isinstance(nonce, str) or not 16 <= len(nonce) <= NONCE_MAX_CHARS:
        raise SignatureRefused("The signature carries no usable nonce (16 to 100 characters).")
    key = f"{fingerprint}:{hashlib.sha256(nonce.encode()).hexdigest()}"
    try:
        fresh = caches["nonces"].add(key, 1, SIGNATURE_MAX_AGE_S + SIGNATURE_SKEW_S)
    except Exception as exc:  # any Redis failure: fail closed
        raise NonceStoreUnavailable() from exc
    if not fresh:
        raise SignatureRefused("This signed request was already received (a replay).")


def upload_digest(request) -> str | None:
    """The hex SHA-256 a signed streamed upload declared for its file (its `Upload-Digest`
    header, covered by the signature), or None when the request has none."""
    value = request.headers.get(UPLOAD_DIGEST, "")
    prefix = "sha-256=:"
    if not value.startswith(prefix) or not value.endswith(":"):
        return None
    try:
        digest = base64.b64decode(value[len(prefix) : -1], validate=True)
    except ValueError:
        return None
    return digest.hex() if len(digest) == 32 else None
