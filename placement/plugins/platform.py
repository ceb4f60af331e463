"""Filters on what the node runs: CPU architecture (and the image's), OS, runtime, network, the
features its agent reports."""

from __future__ import annotations

from .. import reasons as r
from ..registry import register_filter
from ..types import NodeView, Request


@register_filter(
    "arch",
    reasons=(r.ARCH_MISMATCH,),
    reads=("arch",),
    static=True,
    applies=lambda req: bool(req.arch),
)
def arch(req: Request, node: NodeView, policy) -> str | None:
    return r.ARCH_MISMATCH if req.arch and req.arch != node.arch else None


@register_filter(
    "image_arch",
    reasons=(r.IMAGE_ARCH_INCOMPATIBLE,),
    reads=("arch",),
    static=True,
    applies=lambda req: bool(req.image_archs),
)
def image_arch(req: Request, node: NodeView, policy) -> str | None:
    if req.image_archs and node.arch not in req.image_archs:
        return r.IMAGE_ARCH_INCOMPATIBLE
    return None


@register_filter(
    "os", reasons=(r.OS_MISMATCH,), reads=("os",), static=True, applies=lambda req: bool(req.os)
)
def operating_system(req: Request, node: NodeView, policy) -> str | None:
    return r.OS_MISMATCH if req.os and req.os != node.os else None


@register_filter(
    "runtime",
    reasons=(r.RUNTIME_UNSUPPORTED,),
    reads=("runtimes",),
    static=True,
    applies=lambda req: bool(req.runtime),
)
def runtime(req: Request, node: NodeView, policy) -> str | None:
    return r.RUNTIME_UNSUPPORTED if req.runtime and req.runtime not in node.runtimes else None


@register_filter(
    "network_class",
    reasons=(r.NETWORK_CLASS_MISMATCH,),
    reads=("network_class",),
    static=True,
    applies=lambda req: bool(req.network_class),
)
def network_class(req: Request, node: NodeView, policy) -> str | None:
    if req.network_class and req.network_class != node.network_class:
        return r.NETWORK_CLASS_MISMATCH
    return None


@register_filter(
    "node_features",
    reasons=(r.NODE_FEATURE_MISSING,),
    reads=("features",),
    static=True,
    never_lifted=(r.NODE_FEATURE_MISSING,),
    applies=lambda req: bool(req.node_features),
)
def node_features(req: Request, node: NodeView, policy) -> str | None:
    """Refuses a node whose features (its agent's, at enrollment and in heartbeats) lack any of
    the request's: placing work never adds one."""
    if any(feature not in node.features for feature in req.node_features):
        return r.NODE_FEATURE_MISSING
    return None
