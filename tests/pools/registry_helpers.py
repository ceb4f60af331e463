"""Pushing to the real loopback registry with plain HTTP calls (the Registry API v2), so tests
can make images, indexes and cosign signatures of their own in repositories of their own.

Each test pushes into a fresh repository (`computepool/<prefix>-<uuid>`) whose blobs are mounted
from the busybox test image that .ci/ensure-services.sh pushed, so tests never touch each other's
tags and nothing is uploaded twice.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from urllib.parse import urljoin

import requests
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

REGISTRY = "127.0.0.1:5000"
BASE = f"http://{REGISTRY}/v2/"
SOURCE_REPO = "computepool/busybox"
SOURCE_TAG = "test"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
TIMEOUT = 10


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def new_repository(prefix: str = "test") -> str:
    return f"computepool/{prefix}-{uuid.uuid4().hex[:12]}"


def get_manifest(repository: str, reference: str, accept: str = DOCKER_MANIFEST):
    """(bytes, the registry's Docker-Content-Digest)."""
    response = requests.get(
        f"{BASE}{repository}/manifests/{reference}", headers={"Accept": accept}, timeout=TIMEOUT
    )
    response.raise_for_status()
    return response.content, response.headers["Docker-Content-Digest"]


def push_blob(repository: str, data: bytes) -> str:
    """A monolithic upload: POST to open it, PUT the bytes with their digest."""
    digest = digest_of(data)
    opened = requests.post(f"{BASE}{repository}/blobs/uploads/", timeout=TIMEOUT)
    assert opened.status_code == 202, opened.text
    location = urljoin(BASE, opened.headers["Location"])
    separator = "&" if "?" in location else "?"
    done = requests.put(
        f"{location}{separator}digest={digest}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        timeout=TIMEOUT,
    )
    assert done.status_code == 201, done.text
    return digest


def mount_blob(repository: str, digest: str, source: str = SOURCE_REPO):
    """A cross-repository mount: the registry links the blob, nothing is uploaded."""
    response = requests.post(
        f"{BASE}{repository}/blobs/uploads/",
        params={"mount": digest, "from": source},
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, f"mount of {digest} refused: {response.status_code}"


def push_manifest(repository: str, reference: str, body: bytes, media_type: str) -> str:
    response = requests.put(
        f"{BASE}{repository}/manifests/{reference}",
        data=body,
        headers={"Content-Type": media_type},
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    return response.headers["Docker-Content-Digest"]


def copy_test_image(repository: str, tag: str = "v1") -> str:
    """The busybox test image under `repository:tag` (blobs mounted); its manifest digest,
    the same as the source's since the bytes are the same."""
    body, _ = get_manifest(SOURCE_REPO, SOURCE_TAG)
    manifest = json.loads(body)
    for blob in [manifest["config"], *manifest["layers"]]:
        mount_blob(repository, blob["digest"])
    return push_manifest(repository, tag, body, DOCKER_MANIFEST)


def push_image_for(repository: str, architecture: str, tag: str) -> str:
    """An OCI image whose config says `architecture` (its layer is busybox's, mounted)."""
    source = json.loads(get_manifest(SOURCE_REPO, SOURCE_TAG)[0])
    layer = source["layers"][0]
    mount_blob(repository, layer["digest"])
    config = json.dumps(
        {
            "architecture": architecture,
            "os": "linux",
            "config": {"Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": push_blob(repository, config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer["digest"],
                "size": layer["size"],
            }
        ],
    }
    return push_manifest(repository, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def push_index(repository: str, tag: str, entries: list[tuple[str, dict]]) -> str:
    """An OCI index of manifests already in `repository`: [(digest, platform)]."""
    manifests = []
    for digest, platform in entries:
        body, _ = get_manifest(repository, digest, accept=f"{DOCKER_MANIFEST}, {OCI_MANIFEST}")
        media_type = json.loads(body).get("mediaType", OCI_MANIFEST)
        manifests.append(
            {"mediaType": media_type, "digest": digest, "size": len(body), "platform": platform}
        )
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    return push_manifest(repository, tag, json.dumps(index).encode(), OCI_INDEX)


def new_ecdsa_key():
    return ec.generate_private_key(ec.SECP256R1())


def new_ed25519_key():
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(private_key) -> str:
    return (
        private_key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def simple_signing_payload(repository: str, digest: str) -> bytes:
    return json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": f"{REGISTRY}/{repository}"},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": None,
        }
    ).encode()


def sign_bytes(private_key, payload: bytes) -> bytes:
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        return private_key.sign(payload, ec.ECDSA(hashes.SHA256()))
    return private_key.sign(payload)


def push_signature(repository: str, digest: str, private_key, *, signed_digest: str = "") -> str:
    """A cosign signature of `digest` (or, to forge one, a payload naming `signed_digest`) at
    the tag `sha256-<hex>.sig`; returns the signature manifest's digest."""
    payload = simple_signing_payload(repository, signed_digest or digest)
    signature = base64.b64encode(sign_bytes(private_key, payload)).decode()
    config = json.dumps({"architecture": "", "os": "", "rootfs": {"type": "layers"}}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": push_blob(repository, config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": SIMPLE_SIGNING,
                "digest": push_blob(repository, payload),
                "size": len(payload),
                "annotations": {"dev.cosignproject.cosign/signature": signature},
            }
        ],
    }
    tag = digest.replace(":", "-") + ".sig"
    return push_manifest(repository, tag, json.dumps(manifest).encode(), OCI_MANIFEST)
