"""What of a node's raw capacity the scheduler may place on (pure arithmetic)."""


def allocatable_from_raw(
    pool, *, cpu_millicores: int, memory_mib: int, scratch_mib: int
) -> dict[str, int]:
    """allocatable = raw − system reserve − safety margin (a share of what is left)."""
    keep = (100 - pool.safety_margin_percent) / 100

    def usable(raw: int, reserve: int) -> int:
        return max(0, int((raw - reserve) * keep))

    return {
        "cpu_millicores_allocatable": usable(cpu_millicores, pool.system_reserve_cpu_millicores),
        "memory_mib_allocatable": usable(memory_mib, pool.system_reserve_memory_mib),
        "scratch_mib_allocatable": usable(scratch_mib, 0),
    }
