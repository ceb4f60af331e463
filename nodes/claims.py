"""What a validation probe measured against what the node claimed (pure)."""

from .conf import setting


def compare_claims(expected: dict, measured: dict) -> list[str]:
    """Each difference between the claims and the measurement, in words."""
    tolerance = setting("NODE_PROBE_MEMORY_TOLERANCE_PERCENT") / 100
    diffs = []
    claimed_cpu = int(expected.get("cpu_millicores") or 0)
    seen_cpu = int(measured.get("cpu_count") or 0) * 1000
    if "cpu_millicores" in measured:
        seen_cpu = int(measured["cpu_millicores"])
    if seen_cpu < claimed_cpu:
        diffs.append(f"cpu: claimed {claimed_cpu}m, measured {seen_cpu}m")
    claimed_mem = int(expected.get("memory_mib") or 0)
    seen_mem = int(measured.get("memory_mib") or 0)
    if seen_mem < claimed_mem * (1 - tolerance):
        diffs.append(f"memory: claimed {claimed_mem} MiB, measured {seen_mem} MiB")
    seen_gpus = {g.get("uuid"): g for g in measured.get("gpus") or []}
    for gpu in expected.get("gpus") or []:
        seen = seen_gpus.get(gpu.get("uuid"))
        label = f"gpu {gpu.get('index')} ({gpu.get('uuid')})"
        if seen is None:
            diffs.append(f"{label}: claimed {gpu.get('model')}, not seen")
            continue
        if (seen.get("model") or "") != (gpu.get("model") or ""):
            diffs.append(f"{label}: claimed model {gpu.get('model')}, measured {seen.get('model')}")
        claimed = int(gpu.get("memory_mib") or 0)
        got = int(seen.get("memory_mib") or 0)
        if got < claimed * (1 - tolerance):
            diffs.append(f"{label}: claimed {claimed} MiB, measured {got} MiB")
    benchmark = measured.get("benchmark")
    if not isinstance(benchmark, dict) or not benchmark:
        diffs.append("benchmark: no result")
    return diffs
