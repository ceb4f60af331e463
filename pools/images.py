"""Container image references, parsed by the Docker distribution reference grammar
(github.com/distribution/reference) instead of matched as raw strings.

    reference  := name [":" tag] ["@" digest]
    name       := [domain "/"] path-component ["/" path-component]*
    domain     := host [":" port]            (the first component, when it has "." or ":", an
                                              uppercase letter, or is "localhost"; otherwise
                                              the registry is docker.io)
    path-component := [a-z0-9]+ ((\\.|_|__|-+) [a-z0-9]+)*
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := "sha256:" 64 lowercase hex  (the only algorithm we accept)
"""

import re
from dataclasses import dataclass

from pools.statemachine import Refusal

NAME_MAX_CHARS = 255  # as the Docker grammar
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*", re.ASCII)
_DOMAIN_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = re.compile(
    rf"(?:{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?", re.ASCII
)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}", re.ASCII)


class ImageRefused(Refusal):
    """An image a job may not run (422, nothing stored): `image_invalid` (unparsable, missing,
    registry unreachable, wrong architecture), `image_not_allowed` (not from an allowed registry
    of the pool), `image_signature_invalid` (a sensitive pool and no trusted signature)."""

    status = 422
    code = "image_invalid"


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port], e.g. "127.0.0.1:5000"; "docker.io" when the name has none
    repository: str  # path components, e.g. "computepool/busybox"
    tag: str = ""
    digest: str = ""  # "sha256:<64 hex>" or ""

    def is_under(self, prefix: str) -> bool:
        """Whether an allowed-registry prefix ("host[:port]/path/") admits this image: the same
        registry, and the repository is the prefix's path or lies below it (a path boundary,
        so "computepool" does not admit "computepoolevil/x")."""
        registry, _, path = prefix.strip("/").partition("/")
        if registry.lower() != self.registry.lower():
            return False
        return not path or self.repository == path or self.repository.startswith(path + "/")


def parse_image_reference(text: str) -> ImageRef:
    """The components of `text`; ValueError saying what is wrong otherwise."""
    if not text:
        raise ValueError("an image reference is required")
    if re.search(r"[\s#]", text):
        raise ValueError("an image reference has no spaces, newlines or '#'")
    name, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ValueError("a digest is @sha256: followed by exactly 64 lowercase hex characters")
    tag = ""
    last_slash = name.rfind("/")
    if ":" in name[last_slash + 1 :]:
        name, _, tag = name.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise ValueError(f"{tag!r} is not a valid tag")
    if len(name) > NAME_MAX_CHARS:
        raise ValueError(f"an image name has at most {NAME_MAX_CHARS} characters")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            raise ValueError(f"{first!r} is not a valid registry host")
        registry, repository = first, rest
    else:
        registry, repository = "docker.io", name if slash else f"library/{name}"
    for component in repository.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise ValueError(
                f"{component!r} is not a valid repository path component"
                " (lowercase letters and digits, separated by '.', '_', '__' or '-')"
            )
    return ImageRef(registry, repository, tag, digest)
