"""Filters on what the node runs: architecture (and the image's), OS, runtime, network class."""

from dataclasses import replace

import pytest

from placement import reasons as r
from placement.planner import place
from placement.types import Explanation, Placement, Request

from ..factories import POLICY, cpu_node, refusal


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
        (
            "node_features",
            {"node_features": ("avx512", "sgx")},
            {"features": frozenset({"avx512"})},
            r.NODE_FEATURE_MISSING,
        ),
        ("node_features", {"node_features": ("avx512",)}, {}, r.NODE_FEATURE_MISSING),
        (
            "node_features",
            {"node_features": ("avx512", "sgx")},
            {"features": frozenset({"avx512", "sgx", "infiniband"})},
            None,
        ),
        ("node_features", {}, {"features": frozenset({"avx512"})}, None),
    ],
)
def test_platform_filters(name, request_kwargs, node_kwargs, reason):
    assert refusal(name, Request(**request_kwargs), cpu_node(**node_kwargs)) == reason


def test_a_gvisor_request_is_placed_only_where_gvisor_is_offered():
    docker_only = [cpu_node(f"runc-{i}", runtimes=frozenset({"docker", "process"})) for i in (1, 2)]
    sandboxed = cpu_node("runsc-1", runtimes=frozenset({"docker", "gvisor", "process"}))
    request = Request(cpu_millicores=1000, memory_mib=512, runtime="gvisor")

    placed = place(request, [*docker_only, sandboxed], POLICY)
    assert isinstance(placed, Placement) and placed.node == "runsc-1"

    # Without such a node it waits, and "why pending" says why for every node.
    waiting = place(request, docker_only, POLICY)
    assert isinstance(waiting, Explanation)
    assert waiting.reasons == {r.RUNTIME_UNSUPPORTED: 2}
    assert waiting.message.startswith("0 of 2 nodes: 2 runtime_unsupported")
    assert r.DESCRIPTIONS[r.RUNTIME_UNSUPPORTED] == "container runtime not offered"
    # a Docker request still goes anywhere Docker runs
    assert place(replace(request, runtime="docker"), docker_only, POLICY)


def test_a_required_node_feature_is_counted_in_the_explanation_and_never_lifted():
    from placement.registry import FILTERS

    plain = [cpu_node(f"plain-{i}") for i in (1, 2)]
    fast = cpu_node("fast", features=frozenset({"avx512"}))
    request = Request(cpu_millicores=1000, memory_mib=512, node_features=("avx512",))
    placed = place(request, [*plain, fast], POLICY)
    assert isinstance(placed, Placement) and placed.node == "fast"

    refused = place(request, plain, POLICY)
    assert isinstance(refused, Explanation)
    assert dict(refused.reasons) == {r.NODE_FEATURE_MISSING: 2}
    check = FILTERS["node_features"]
    assert check.static and check.never_lifted == {r.NODE_FEATURE_MISSING}
