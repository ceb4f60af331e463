"""Image signatures in cosign's format, verified offline against a pool's trusted keys.

cosign stores the signature of the image whose manifest digest is `sha256:<hex>` in the same
repository under the tag `sha256-<hex>.sig`: an OCI manifest with one layer per signature. Each
layer (media type `application/vnd.dev.cosign.simplesigning.v1+json`) is the simple-signing
payload

    {"critical": {"identity": {"docker-reference": "<repository>"},
                  "image": {"docker-manifest-digest": "sha256:<hex>"},
                  "type": "cosign container image signature"},
     "optional": {...}}

and its annotation `dev.cosignproject.cosign/signature` is the base64 signature over the
payload's bytes: ECDSA with SHA-256 (cosign's default keys are P-256), Ed25519, or RSA
PKCS#1 v1.5 with SHA-256. An image is signed when one layer's signature verifies with one of the
keys and its payload names exactly this digest (as cosign checks; the identity is not compared,
so a signed image copied to another repository of an allowed registry stays signed).
No transparency log and no certificates (keyless signing): keys only, nothing online.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from pools.registry import OCI_MANIFEST, RegistryError, fetch_blob, fetch_manifest

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
PAYLOAD_MAX_BYTES = 256 * 1024
MAX_SIGNATURES = 16  # layers looked at in one .sig manifest: bounded network work per submit


class SignatureInvalid(Exception):
    """No signature of the image verifies with a trusted key; the message says what was found."""


def signature_tag(digest: str) -> str:
    return digest.replace(":", "-", 1) + ".sig"


def load_public_keys(pems) -> list:
    """The keys that parse (a malformed one is skipped: it can verify nothing)."""
    keys = []
    for pem in pems:
        try:
            keys.append(serialization.load_pem_public_key(pem.encode()))
        except (ValueError, TypeError, AttributeError):
            continue
    return keys


def _verifies(key, signature: bytes, payload: bytes) -> bool:
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, payload)
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, payload, padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except (InvalidSignature, ValueError, TypeError):  # a malformed signature verifies nothing
        return False
    return True


def _signed_digest(payload: bytes) -> str:
    """The manifest digest a simple-signing payload vouches for ("" when it is not one)."""
    try:
        critical = json.loads(payload).get("critical") or {}
        if critical.get("type") != SIGNATURE_TYPE:
            return ""
        digest = critical["image"]["docker-manifest-digest"]
    except (ValueError, AttributeError, KeyError, TypeError):
        return ""
    return digest if isinstance(digest, str) else ""


def verify_image_signature(registry: str, repository: str, digest: str, public_key_pems) -> None:
    """Returns when a trusted key signed exactly `digest`; SignatureInvalid saying why not."""
    keys = load_public_keys(public_key_pems)
    if not keys:
        raise SignatureInvalid("the pool trusts no (valid) public key, so no image is accepted")
    try:
        manifest = fetch_manifest(registry, repository, signature_tag(digest), accept=OCI_MANIFEST)
    except RegistryError as exc:
        raise SignatureInvalid(
            f"the image is not signed: no signature {signature_tag(digest)} could be read ({exc})"
        ) from exc
    # The registry's JSON is untrusted: anything not shaped as cosign writes it is skipped.
    layers = manifest.body.get("layers")
    layers = [
        layer
        for layer in (layers if isinstance(layers, list) else [])
        if isinstance(layer, dict) and layer.get("mediaType") == SIMPLE_SIGNING
    ][:MAX_SIGNATURES]
    other_digest = unverified = 0
    for layer in layers:
        annotations = layer.get("annotations")
        encoded = annotations.get(SIGNATURE_ANNOTATION) if isinstance(annotations, dict) else None
        try:
            if not isinstance(encoded, str):
                raise ValueError("no signature annotation")
            signature = base64.b64decode(encoded, validate=True)
            payload = fetch_blob(
                registry, repository, layer.get("digest") or "", limit=PAYLOAD_MAX_BYTES
            )
        except (binascii.Error, ValueError, RegistryError):
            unverified += 1
            continue
        if not any(_verifies(key, signature, payload) for key in keys):
            unverified += 1
        elif _signed_digest(payload) != digest:
            other_digest += 1  # a genuine signature, of another image
        else:
            return
    if not layers:
        raise SignatureInvalid(f"the image is not signed: {signature_tag(digest)} has no signature")
    if other_digest:
        raise SignatureInvalid("the image's signatures by a trusted key are for another digest")
    raise SignatureInvalid(
        f"none of the image's {unverified} signature(s) verifies with a key the pool trusts"
    )
