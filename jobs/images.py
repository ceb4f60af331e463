"""Which image a job runs: the submitted reference, admitted by the pool and pinned to the
digest the registry names now. Everything is decided at submit, before anything is stored or
reserved; the job then only ever stores and runs the digest (the agent refuses anything else).

    parse          ─▶ allowed registry  ─▶ registry: tag → digest, platforms ─▶ architecture
    image_invalid     image_not_allowed    image_invalid                       image_invalid
    ─▶ signature (sensitive pools)
       image_signature_invalid
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.selectors import image_refusal
from pools.images import ImageRefused, parse_image_reference
from pools.reasons import Reason
from pools.registry import RegistryError, ResolvedImage, resolve
from pools.signatures import SignatureInvalid, verify_image_signature

IMAGE_MAX_CHARS = 300  # Job.image


@dataclass(frozen=True)
class AdmittedImage:
    pinned: str  # "<registry>/<repository>@sha256:<hex>": what the job stores and runs
    requested: str  # what was submitted
    resolved: ResolvedImage

    @property
    def platforms(self) -> list[str]:
        """What the job stores as `image_platforms`: ["linux/amd64", "linux/arm64/v8"]."""
        return sorted({str(p) for p in self.resolved.platforms})


def admit_image(pool, image: str, *, architecture: str = "", os: str = "linux") -> AdmittedImage:
    """The image pinned to its digest, or ImageRefused (422) with the reason code and a message
    that says what to change. `architecture`/`os`: the job's request ("" = any)."""
    try:
        ref = parse_image_reference(image)
    except ValueError as exc:
        raise ImageRefused(f"{image[:100]!r}: {exc}", code=Reason.IMAGE_INVALID) from exc
    refusal = image_refusal(pool, ref)
    if refusal:
        raise ImageRefused(refusal, code=Reason.IMAGE_NOT_ALLOWED)
    try:
        # A digest wins over a tag given beside it ("repo:tag@sha256:…"), as Docker does.
        resolved = resolve(ref.registry, ref.repository, ref.digest or ref.tag or "latest")
    except RegistryError as exc:
        raise ImageRefused(f"{image}: {exc}", code=Reason.IMAGE_INVALID) from exc
    _check_platform(image, resolved, architecture=architecture, os=os)
    if pool.sensitive:
        keys = list(pool.trusted_keys.values_list("public_key_pem", flat=True))
        try:
            verify_image_signature(ref.registry, ref.repository, resolved.digest, keys)
        except SignatureInvalid as exc:
            message = f"pool {pool.slug} accepts only signed images: {exc}"
            raise ImageRefused(message, code=Reason.IMAGE_SIGNATURE_INVALID) from exc
    if len(resolved.pinned) > IMAGE_MAX_CHARS:  # the name and the digest, as the job stores it
        message = (
            f"{image}: pinned to its digest the reference exceeds {IMAGE_MAX_CHARS} characters"
        )
        raise ImageRefused(message, code=Reason.IMAGE_INVALID)
    return AdmittedImage(pinned=resolved.pinned, requested=image, resolved=resolved)


def _check_platform(image: str, resolved: ResolvedImage, *, architecture: str, os: str):
    if not resolved.platforms:
        message = f"{image}: the registry does not say which platform the image is built for"
        raise ImageRefused(message, code=Reason.IMAGE_INVALID)
    if any(
        (not architecture or p.architecture == architecture) and (not os or p.os == os)
        for p in resolved.platforms
    ):
        return
    built_for = ", ".join(sorted({str(p) for p in resolved.platforms}))
    wanted = "/".join(part for part in (os, architecture) if part)
    message = f"{image} is built for {built_for}, the job asks for {wanted}"
    raise ImageRefused(message, code=Reason.IMAGE_INVALID)
