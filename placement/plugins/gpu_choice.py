"""How a fractional share chooses among the devices that can take it (``Policy.gpu_choice``):
the devices it is scored on, ties going to the first."""

from __future__ import annotations

from ..registry import register_gpu_choice


@register_gpu_choice("fragmentation")
def every_free_level(devices, req, ctx) -> list:
    """One device per distinct free level, lowest index first: the scorers (FGD) decide."""
    seen, out = set(), []
    for d in devices:
        if d.free_milli not in seen:
            seen.add(d.free_milli)
            out.append(d)
    return out


@register_gpu_choice("best_fit")
def best_fit(devices, req, ctx) -> list:
    """The device with the least free room that fits (then the lowest index)."""
    return [min(devices, key=lambda d: (d.free_milli, d.index))]


@register_gpu_choice("lowest_index")
def lowest_index(devices, req, ctx) -> list:
    return [devices[0]]


@register_gpu_choice("random", draws_random=True)
def random_device(devices, req, ctx) -> list:
    return [ctx.rng.choice(devices)]
