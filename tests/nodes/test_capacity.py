"""Allocatable capacity from raw (nodes/capacity.py)."""

from nodes.capacity import allocatable_from_raw


def test_allocatable_is_raw_minus_reserve_minus_margin(private_pool):
    alloc = allocatable_from_raw(
        private_pool, cpu_millicores=64000, memory_mib=512000, scratch_mib=1000
    )
    # reserve 500m / 1024 MiB, margin 5 %
    assert alloc == {
        "cpu_millicores_allocatable": int((64000 - 500) * 0.95),
        "memory_mib_allocatable": int((512000 - 1024) * 0.95),
        "scratch_mib_allocatable": 950,
    }
