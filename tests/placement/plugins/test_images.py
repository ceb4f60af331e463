"""The image cache: required warm (filter) or preferred warm (scorer)."""

from dataclasses import replace

from placement import reasons as r
from placement.plugins.images import warm_image
from placement.types import Request

from ..factories import cpu_node, ctx_for, fit_on, refusal


def test_a_shape_that_requires_a_warm_image_refuses_cold_nodes():
    node = cpu_node(warm_images=frozenset({"sha256:a"}))
    cold = Request(image="sha256:b", require_warm_image=True)
    assert refusal("warm_image", cold, node) == r.IMAGE_NOT_WARM
    assert refusal("warm_image", replace(cold, image="sha256:a"), node) is None
    assert refusal("warm_image", replace(cold, require_warm_image=False), node) is None


def test_warm_nodes_score_higher():
    node = cpu_node(warm_images=frozenset({"sha256:x"}))
    ctx = ctx_for([node])
    assert warm_image(Request(image="sha256:x"), node, fit_on(node), ctx) == 1.0
    assert warm_image(Request(image="sha256:y"), node, fit_on(node), ctx) == 0.0
