"""When a GPU is unsuitable for work, from its NVML readings (pure).

One rule per reading, each with its own reason code (pools/reasons.py, docs/reason-codes.md):
a device that breaks one leaves scheduling alone (nodes/services/health.py). Thresholds are
settings (nodes/conf.py, docs/nodes.md "Device health"). A reading the device does not
support is absent from the report, and a rule whose reading is absent finds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pools.reasons import Reason

from .choices import GpuHealth
from .conf import setting

# the throttle reasons that mean the hardware slows the device down (never idle, application
# clocks, the software power cap or a software thermal target: those are settings and load)
HW_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
NVLINK_CRC = ("crc_flit", "crc_data")

# what names a device's health when several rules find something (the first wins)
HEALTH_ORDER = (
    GpuHealth.ERROR,
    GpuHealth.HEALTH_CHECK_FAILED,
    GpuHealth.TOO_HOT,
    GpuHealth.DEGRADED_LINK,
)
# the flags the scheduler and the console knew before the rules had codes (kept beside them)
LEGACY_FLAG = {
    GpuHealth.ERROR: "xid_error",
    GpuHealth.HEALTH_CHECK_FAILED: "health_check_failed",
    GpuHealth.TOO_HOT: "over_temperature",
    GpuHealth.DEGRADED_LINK: "pcie_degraded",
}


@dataclass(frozen=True)
class Finding:
    """One rule a reading broke: its reason code, the device health it means, in words."""

    code: str
    health: str
    why: str
    data: dict | None = None


def _int(report: dict, key: str) -> int:
    value = report.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _xid_rule(report: dict) -> list[Finding]:
    critical = set(setting("NODE_GPU_CRITICAL_XIDS"))
    xids = [x for x in report.get("xids") or () if x in critical]
    if xids:
        shown = ", ".join(str(x) for x in dict.fromkeys(xids))
        return [Finding(Reason.GPU_XID, GpuHealth.ERROR, f"Xid {shown}", {"xids": xids[:16]})]
    if report.get("xid_errors") or report.get("error"):  # an agent from before the Xid list
        return [Finding(Reason.GPU_XID, GpuHealth.ERROR, report.get("error") or "Xid error")]
    return []


def _ecc_rules(report: dict) -> list[Finding]:
    found = []
    volatile = max(_int(report, "ecc_volatile_uncorrected"), _int(report, "ecc_errors_uncorrected"))
    if volatile:
        found.append(
            Finding(
                Reason.GPU_ECC_UNCORRECTED,
                GpuHealth.ERROR,
                f"{volatile} uncorrected ECC error(s) since the driver loaded",
            )
        )
    aggregate = _int(report, "ecc_aggregate_uncorrected")
    limit = setting("NODE_GPU_ECC_AGGREGATE_UNCORRECTED_MAX")
    if aggregate >= limit:
        found.append(
            Finding(
                Reason.GPU_ECC_AGGREGATE_THRESHOLD,
                GpuHealth.ERROR,
                f"{aggregate} uncorrected ECC errors in the device's life (≥ {limit})",
            )
        )
    return found


def _retirement_rules(report: dict) -> list[Finding]:
    found = []
    if report.get("retired_pages_pending") is True or report.get("remapped_rows_pending") is True:
        what = "page retirement" if report.get("retired_pages_pending") is True else "row remap"
        found.append(
            Finding(
                Reason.GPU_RETIRED_PAGES_PENDING,
                GpuHealth.ERROR,
                f"a {what} waits for a GPU reset",
            )
        )
    retired = _int(report, "retired_pages_sbe") + _int(report, "retired_pages_dbe")
    if report.get("remapped_rows_failure") is True or retired >= setting(
        "NODE_GPU_RETIRED_PAGES_MAX"
    ):
        why = (
            "a row remap failed"
            if report.get("remapped_rows_failure") is True
            else f"{retired} pages retired"
        )
        found.append(Finding(Reason.GPU_ROW_REMAP_FAILURE, GpuHealth.ERROR, why))
    return found


def _temperature_rules(report: dict) -> list[Finding]:
    found = []
    temperature = report.get("temperature_c")
    limit = report.get("slowdown_temperature_c") or setting("NODE_GPU_MAX_TEMPERATURE_C")
    if temperature is not None and temperature >= limit:
        found.append(Finding(Reason.GPU_TOO_HOT, GpuHealth.TOO_HOT, f"{temperature}°C ≥ {limit}°C"))
    hardware = [r for r in report.get("throttle_reasons") or () if r in HW_THROTTLE_REASONS]
    if hardware:
        health = GpuHealth.TOO_HOT if "hw_thermal_slowdown" in hardware else GpuHealth.ERROR
        found.append(
            Finding(
                Reason.GPU_THROTTLED,
                health,
                "clocks slowed by the hardware: " + ", ".join(hardware),
                {"throttle_reasons": hardware},
            )
        )
    return found


def _link_rules(report: dict) -> list[Finding]:
    found = []
    width, width_max = report.get("pcie_link_width"), report.get("pcie_link_width_max")
    if width and width_max and width < width_max:
        found.append(
            Finding(
                Reason.GPU_PCIE_DEGRADED, GpuHealth.DEGRADED_LINK, f"link x{width} of x{width_max}"
            )
        )
    if report.get("nvlink_down"):
        found.append(
            Finding(
                Reason.GPU_NVLINK_DOWN,
                GpuHealth.DEGRADED_LINK,
                f"{report['nvlink_down']} NVLink(s) down",
            )
        )
    return found


def nvlink_error_rates(report: dict, previous: dict | None) -> dict | None:
    """{"crc_per_s", "replay_per_s", "recovery"} since the previous reading of the same
    device ({"at": seconds, "counters": {...}}), or None when there is nothing to compare: no
    counters now or then, no time between, or a counter that went down (the driver reloaded,
    which starts them again from 0: the new reading is the next baseline)."""
    now, then = report.get("nvlink_errors"), (previous or {}).get("counters")
    seconds = float(report.get("_at", 0)) - float((previous or {}).get("at", 0))
    if not now or not then or seconds <= 0:
        return None
    delta = {}
    for key in set(now) & set(then):
        if int(now[key]) < int(then[key]):
            return None
        delta[key] = int(now[key]) - int(then[key])
    return {
        "crc_per_s": sum(delta.get(k, 0) for k in NVLINK_CRC) / seconds,
        "replay_per_s": delta.get("replay", 0) / seconds,
        "recovery": delta.get("recovery", 0),
        "seconds": round(seconds, 1),
    }


def _nvlink_error_rules(report: dict, previous: dict | None) -> list[Finding]:
    rates = nvlink_error_rates(report, previous)
    if rates is None:
        return []
    crc_max = setting("NODE_GPU_NVLINK_CRC_PER_S_MAX")
    replay_max = setting("NODE_GPU_NVLINK_REPLAY_PER_S_MAX")
    why = []
    if rates["crc_per_s"] >= crc_max:
        why.append(f"{rates['crc_per_s']:.1f} CRC errors/s (≥ {crc_max})")
    if rates["replay_per_s"] >= replay_max:
        why.append(f"{rates['replay_per_s']:.1f} replays/s (≥ {replay_max})")
    if rates["recovery"]:
        why.append(f"{rates['recovery']} link recoveries")
    if not why:
        return []
    return [
        Finding(
            Reason.GPU_NVLINK_ERRORS,
            GpuHealth.DEGRADED_LINK,
            "NVLink " + ", ".join(why) + f" in {rates['seconds']} s",
            {"nvlink_rates": rates},
        )
    ]


def gpu_health_findings(report: dict, previous: dict | None = None) -> list[Finding]:
    """Every rule one device's readings break, in a stable order. `previous`: the device's
    NVLink counters at its previous reading ({"at", "counters"}), for the rate rule; `report`
    may carry `_at` (seconds) for that comparison."""
    findings = [
        *_xid_rule(report),
        *_ecc_rules(report),
        *_retirement_rules(report),
    ]
    if report.get("health_check") == "failed":
        findings.append(
            Finding(
                Reason.GPU_HEALTH_CHECK_FAILED, GpuHealth.HEALTH_CHECK_FAILED, "health check failed"
            )
        )
    findings += _temperature_rules(report)
    findings += _link_rules(report)
    findings += _nvlink_error_rules(report, previous)
    return findings


def gpu_health_evaluate(report: dict, previous: dict | None = None) -> tuple[str, list[str], str]:
    """(health, flags, reason) for one device's health report (NVML readings): the health of
    the gravest rule broken (GpuHealth.OK when none), as flags the reason codes of every rule
    broken and the legacy flag of each health (xid_error, health_check_failed,
    over_temperature, pcie_degraded), and the rules in words."""
    findings = gpu_health_findings(report, previous)
    if not findings:
        return GpuHealth.OK, [], ""
    healths = {f.health for f in findings}
    health = next(h for h in HEALTH_ORDER if h in healths)
    flags = [LEGACY_FLAG[h] for h in HEALTH_ORDER if h in healths]
    flags += list(dict.fromkeys(str(f.code) for f in findings))
    return health, flags, "; ".join(f.why for f in findings)
