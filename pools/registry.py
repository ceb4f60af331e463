"""A small client of the Docker Registry HTTP API v2 (the OCI distribution spec): resolve a
reference to the digest of its manifest and the platforms it is built for, and read blobs.

Only what the control plane needs at submit: `GET /v2/<repo>/manifests/<tag-or-digest>` and
`GET /v2/<repo>/blobs/<digest>`. Every body is bounded and checked against its digest, so a
registry (or anything between us and it) cannot hand us another image than the digest says.
Registries are reached over https, except the hosts in `REGISTRY_INSECURE_HOSTS` (none by
default; `make run` and the tests: the loopback test registry), over plain http. No
credentials: a registry that asks for them is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import requests
from django.conf import settings

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join(INDEX_TYPES + MANIFEST_TYPES)
# The distribution registry refuses manifests over 4 MiB; image configs are a few KiB.
MANIFEST_MAX_BYTES = 4 * 1024 * 1024
BLOB_MAX_BYTES = 4 * 1024 * 1024
# Docker's names for what a kernel reports (uname -m), so configs written either way compare.
DIGEST = re.compile(r"sha256:[a-f0-9]{64}", re.ASCII)
_ARCH_ALIASES = {"x86_64": "amd64", "aarch64": "arm64"}


class RegistryError(Exception):
    """The registry did not give us the image: missing, unreachable, refusing, or inconsistent.
    The message says which, in words a person submitting a job understands."""


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    def __str__(self):
        return "/".join(part for part in (self.os, self.architecture, self.variant) if part)


@dataclass(frozen=True)
class Manifest:
    digest: str  # "sha256:<hex>" of the exact bytes
    media_type: str
    body: dict


@dataclass(frozen=True)
class ResolvedImage:
    registry: str
    repository: str
    digest: str  # of the manifest or index the reference names: what the job stores and runs
    platforms: tuple[Platform, ...]

    @property
    def pinned(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def architectures(self) -> tuple[str, ...]:
        return tuple(sorted({p.architecture for p in self.platforms}))


def base_url(registry: str) -> str:
    insecure = {host.strip().lower() for host in settings.REGISTRY_INSECURE_HOSTS if host.strip()}
    scheme = "http" if registry.lower() in insecure else "https"
    return f"{scheme}://{registry}/v2/"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _get(registry: str, path: str, *, accept: str = "", what: str) -> requests.Response:
    url = base_url(registry) + path
    try:
        response = requests.get(
            url,
            headers={"Accept": accept} if accept else {},
            timeout=settings.REGISTRY_TIMEOUT_SECONDS,
            stream=True,
        )
    except requests.RequestException as exc:
        raise RegistryError(
            f"registry {registry} could not be reached ({type(exc).__name__})"
        ) from exc
    if response.status_code == 200:
        return response
    response.close()
    if response.status_code == 404:
        raise RegistryError(f"{what} does not exist in registry {registry}")
    if response.status_code in (401, 403):
        raise RegistryError(
            f"registry {registry} asks for credentials to read {what}, which are not supported"
        )
    raise RegistryError(f"registry {registry} answered HTTP {response.status_code} for {what}")


def _read_bounded(response: requests.Response, limit: int, *, what: str) -> bytes:
    declared = response.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        response.close()
        raise RegistryError(f"{what} is larger than {limit} bytes")
    chunks, size = [], 0
    try:
        for chunk in response.iter_content(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise RegistryError(f"{what} is larger than {limit} bytes")
            chunks.append(chunk)
    except requests.RequestException as exc:
        raise RegistryError(f"reading {what} failed ({type(exc).__name__})") from exc
    finally:
        response.close()
    return b"".join(chunks)


def fetch_manifest(registry: str, repository: str, reference: str, *, accept: str = ACCEPT):
    """The manifest (or index) named by a tag or a digest, its digest checked against its
    bytes: the registry's Docker-Content-Digest, and the digest asked for, must both match."""
    what = f"{registry}/{repository}{'@' if reference.startswith('sha256:') else ':'}{reference}"
    response = _get(registry, f"{repository}/manifests/{reference}", accept=accept, what=what)
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    header_digest = response.headers.get("Docker-Content-Digest", "")
    body = _read_bounded(response, MANIFEST_MAX_BYTES, what=f"the manifest of {what}")
    digest = sha256_digest(body)
    for claimed in (header_digest, reference if reference.startswith("sha256:") else ""):
        if claimed and claimed != digest:
            raise RegistryError(
                f"registry {registry} sent a manifest for {what} whose sha256 is {digest},"
                f" not {claimed}"
            )
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise RegistryError(f"the manifest of {what} is not JSON") from exc
    if not isinstance(document, dict):
        raise RegistryError(f"the manifest of {what} is not a JSON object")
    media_type = document.get("mediaType") or media_type
    return Manifest(digest=digest, media_type=media_type, body=document)


def fetch_blob(registry: str, repository: str, digest: str, *, limit: int = BLOB_MAX_BYTES):
    """A blob's bytes, checked against its digest."""
    what = f"blob {digest} of {registry}/{repository}"
    if not isinstance(digest, str) or not DIGEST.fullmatch(
        digest
    ):  # it goes into the URL: never a path of our choosing
        raise RegistryError(f"{what} is not named by a sha256 digest")
    response = _get(registry, f"{repository}/blobs/{digest}", what=what)
    data = _read_bounded(response, limit, what=what)
    if sha256_digest(data) != digest:
        raise RegistryError(f"registry {registry} sent {what} with other content")
    return data


def _descriptor_digest(descriptor) -> str:
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise RegistryError("a manifest names a blob without a sha256 digest")
    return digest


def _platform(data) -> Platform | None:
    if not isinstance(data, dict):
        return None
    os_name, arch = data.get("os"), data.get("architecture")
    if not isinstance(os_name, str) or not isinstance(arch, str):
        return None
    variant = data.get("variant") if isinstance(data.get("variant"), str) else ""
    return Platform(os_name, _ARCH_ALIASES.get(arch, arch), variant)


def platforms_of(registry: str, repository: str, manifest: Manifest) -> tuple[Platform, ...]:
    """What an index lists per entry (attestations, platform unknown/unknown, left out), or what
    a single manifest's config blob says."""
    if manifest.media_type in INDEX_TYPES:
        entries = manifest.body.get("manifests")
        entries = entries if isinstance(entries, list) else []
        found = [_platform(e.get("platform")) for e in entries if isinstance(e, dict)]
        return tuple(p for p in found if p and p.os != "unknown" and p.architecture != "unknown")
    if manifest.media_type in MANIFEST_TYPES:
        config_digest = _descriptor_digest(manifest.body.get("config"))
        config = fetch_blob(registry, repository, config_digest)
        try:
            platform = _platform(json.loads(config))
        except ValueError as exc:
            raise RegistryError("the image's config is not JSON") from exc
        return (platform,) if platform else ()
    raise RegistryError(f"unsupported manifest media type {manifest.media_type or '(none)'}")


def resolve(registry: str, repository: str, reference: str) -> ResolvedImage:
    """The digest a tag (or digest) names now, and the platforms the image is built for."""
    manifest = fetch_manifest(registry, repository, reference)
    platforms = platforms_of(registry, repository, manifest)
    return ResolvedImage(registry, repository, manifest.digest, platforms)
