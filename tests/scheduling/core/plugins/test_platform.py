"""Filters on what the node runs: architecture (and the image's), OS, runtime, network class."""

import pytest

from scheduling.core import reasons as r
from scheduling.core.types import Request

from ..factories import cpu_node, refusal


@pytest.mark.parametrize(
    ("name", "request_kwargs", "node_kwargs", "reason"),
    [
        ("arch", {"arch": "arm64"}, {"arch": "amd64"}, r.ARCH_MISMATCH),
        ("arch", {"arch": "arm64"}, {"arch": "arm64"}, None),
        ("image_arch", {"image_archs": ("arm64",)}, {"arch": "amd64"}, r.IMAGE_ARCH_INCOMPATIBLE),
        ("image_arch", {"image_archs": ("arm64", "amd64")}, {"arch": "arm64"}, None),
        ("os", {"os": "windows"}, {}, r.OS_MISMATCH),
        ("os", {"os": "linux"}, {}, None),
        (
            "runtime",
            {"runtime": "podman"},
            {"runtimes": frozenset({"docker"})},
            r.RUNTIME_UNSUPPORTED,
        ),
        ("runtime", {"runtime": "podman"}, {"runtimes": frozenset({"docker", "podman"})}, None),
        (
            "network_class",
            {"network_class": "ib"},
            {"network_class": "eth"},
            r.NETWORK_CLASS_MISMATCH,
        ),
        ("network_class", {"network_class": "ib"}, {"network_class": "ib"}, None),
    ],
)
def test_platform_filters(name, request_kwargs, node_kwargs, reason):
    assert refusal(name, Request(**request_kwargs), cpu_node(**node_kwargs)) == reason
