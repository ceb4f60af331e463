"""MIG profiles of A100 and H100 GPUs and their valid placements.

A MIG-enabled GPU has 8 memory slices (7 usable compute slices). A profile occupies a fixed
number of memory slices and may only start at the positions NVIDIA allows (e.g. a 3g profile
starts at slice 0 or 4). A placement is valid when its slice range does not overlap a slice
already carved on the device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    slices: int  # memory slices occupied, out of 8
    starts: tuple[int, ...]  # valid start positions
    memory_mib: int
    compute_milli: int  # share of the device's compute, in milli-GPU (g/7)


def _profiles(memory_gib_per_slice: int) -> dict[str, MigProfile]:
    m = memory_gib_per_slice
    table = [
        (f"1g.{m}gb", 1, (0, 1, 2, 3, 4, 5, 6), m, 1),
        (f"1g.{2 * m}gb", 2, (0, 2, 4, 6), 2 * m, 1),
        (f"2g.{2 * m}gb", 2, (0, 2, 4), 2 * m, 2),
        (f"3g.{4 * m}gb", 4, (0, 4), 4 * m, 3),
        (f"4g.{4 * m}gb", 4, (0,), 4 * m, 4),
        (f"7g.{8 * m}gb", 8, (0,), 8 * m, 7),
    ]
    return {
        name: MigProfile(name, slices, starts, mem * 1024, g * 1000 // 7)
        for name, slices, starts, mem, g in table
    }


# A100 40GB uses 5 GB slices, A100/H100 80GB 10 GB slices, H100 94/96GB 12 GB, H200 18 GB.
_A100_40 = _profiles(5)
_X_80 = _profiles(10)
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _A100_40,
    "A100-80GB": _X_80,
    "H100-80GB": _X_80,
    "H100-94GB": _profiles(12),
    "H200-141GB": _profiles(18),
}


def profiles_for(model: str, memory_mib: int = 0) -> dict[str, MigProfile]:
    """Profiles a device supports, by its model name (and memory when the name is ambiguous)."""
    if model in MIG_PROFILES:
        return MIG_PROFILES[model]
    upper = model.upper()
    if "A100" in upper:
        return _A100_40 if 0 < memory_mib <= 41 * 1024 or "40" in upper else _X_80
    if "H100" in upper or "H200" in upper or "H800" in upper or "A30" in upper:
        return _X_80 if "A30" not in upper else _profiles(6)
    return {}


def occupied_slices(slices, profiles: dict[str, MigProfile]) -> set[int]:
    used: set[int] = set()
    for s in slices:
        profile = profiles.get(s.profile)
        size = profile.slices if profile else 1
        used.update(range(s.start, s.start + size))
    return used


def free_starts(profile: MigProfile, used: set[int]) -> list[int]:
    """Valid start positions for ``profile`` that do not overlap ``used`` slices."""
    return [
        start
        for start in profile.starts
        if start + profile.slices <= 8
        and not used.intersection(range(start, start + profile.slices))
    ]


def layout_starts(profile: MigProfile, used: set[int], layout) -> list[int]:
    """Where a slice of ``profile`` can be placed on a device: with the device's real layout
    (``layout``: the MIG instances its agent reported through NVML, each a profile and start)
    only at an instance of that profile whose slices are free; without one (an agent that does
    not report placements: None) at any valid free start, as if instances were carved to
    order."""
    free = free_starts(profile, used)
    if layout is None:
        return free
    carved = {s.start for s in layout if s.profile == profile.name}
    return [start for start in free if start in carved]
