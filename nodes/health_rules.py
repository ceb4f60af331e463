"""When a GPU is unsuitable for work, from its NVML readings (pure)."""

from .choices import GpuHealth
from .conf import setting

# the first flag found names the device's health
HEALTH_BY_FLAG = (
    ("xid_error", GpuHealth.ERROR),
    ("health_check_failed", GpuHealth.HEALTH_CHECK_FAILED),
    ("over_temperature", GpuHealth.TOO_HOT),
    ("pcie_degraded", GpuHealth.DEGRADED_LINK),
)


def gpu_health_evaluate(report: dict) -> tuple[str, list[str], str]:
    """(health, flags, reason) for one device's health report (NVML readings)."""
    flags, why = [], []
    if report.get("xid_errors") or report.get("ecc_errors_uncorrected") or report.get("error"):
        flags.append("xid_error")
        why.append(report.get("error") or "device error (XID/ECC)")
    if report.get("health_check") == "failed":
        flags.append("health_check_failed")
        why.append("health check failed")
    temperature = report.get("temperature_c")
    limit = report.get("slowdown_temperature_c") or setting("NODE_GPU_MAX_TEMPERATURE_C")
    if temperature is not None and temperature >= limit:
        flags.append("over_temperature")
        why.append(f"{temperature}°C ≥ {limit}°C")
    width, width_max = report.get("pcie_link_width"), report.get("pcie_link_width_max")
    if (width and width_max and width < width_max) or report.get("nvlink_down"):
        flags.append("pcie_degraded")
        why.append(f"link x{width} of x{width_max}" if width else "NVLink down")
    health = next((h for flag, h in HEALTH_BY_FLAG if flag in flags), GpuHealth.OK)
    return health, flags, "; ".join(why)
