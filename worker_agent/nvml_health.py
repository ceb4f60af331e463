"""A GPU's health as NVML reads it: ECC counters, retired pages and remapped rows, Xid events,
clock throttle reasons and NVLink error counters (docs/nodes.md "Device health").

Every reading is optional: a call a device or driver does not support (NVMLError_NotSupported,
or any other NVML error) leaves its field out, never fails the heartbeat. The agent only reads
and reports; the control plane judges the readings (nodes/health_rules.py), one rule and one
reason code per reading. The same code runs against the real `pynvml` and against a recording
(`worker_agent.inventory.RecordedNvml`), which answers the same calls.
"""

from __future__ import annotations

import logging

import pynvml

log = logging.getLogger(__name__)

# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits, by the names the control plane reads
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# NVLink data-link error counters (nvmlNvLinkErrorCounter_t), by name
NVLINK_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
XIDS_PER_READING = 64  # what one heartbeat carries at most (the schema's bound)
COUNTER_MAX = 2**63 - 1


def _optional(call, *args):
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None
    except (AttributeError, TypeError):  # an older pynvml without the function
        return None


def _count(value) -> int | None:
    if value is None:
        return None
    return max(0, min(int(value), COUNTER_MAX))


def throttle_names(mask: int) -> list[str]:
    """The named bits of a clocks event (throttle) reason mask, in bit order."""
    return [name for bit, name in THROTTLE_REASONS.items() if int(mask) & bit]


def ecc_readings(nvml, handle) -> dict:
    """Volatile (since the driver loaded) and aggregate (the device's life) ECC error counts,
    corrected and uncorrected; each absent where ECC is off or not supported."""
    out = {}
    for counter, when in (
        (nvml.NVML_VOLATILE_ECC, "volatile"),
        (nvml.NVML_AGGREGATE_ECC, "aggregate"),
    ):
        for kind, what in (
            (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
            (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
        ):
            value = _count(_optional(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter))
            if value is not None:
                out[f"ecc_{when}_{what}"] = value
    return out


def retirement_readings(nvml, handle) -> dict:
    """Pages retired for ECC errors and whether a retirement waits for a reset (pre-A100), and
    row remapping (A100 and later): rows remapped, a remap pending, a remap that failed."""
    out = {}
    for cause, what in (
        (nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "sbe"),
        (nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "dbe"),
    ):
        pages = _optional(nvml.nvmlDeviceGetRetiredPages_v2, handle, cause)
        if pages is not None:
            out[f"retired_pages_{what}"] = _count(len(pages))
    pending = _optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if pending is not None:
        out["retired_pages_pending"] = int(pending) == nvml.NVML_FEATURE_ENABLED
    rows = _optional(nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is not None and len(rows) == 4:
        correctable, uncorrectable, pending_rows, failure = rows
        out |= {
            "remapped_rows_correctable": _count(correctable),
            "remapped_rows_uncorrectable": _count(uncorrectable),
            "remapped_rows_pending": bool(pending_rows),
            "remapped_rows_failure": bool(failure),
        }
    return out


def throttle_reading(nvml, handle) -> dict:
    """The current clocks event reasons (nvmlDeviceGetCurrentClocksEventReasons, named
    ...ThrottleReasons before driver 535), as names."""
    mask = _optional(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None), handle)
    if mask is None:
        mask = _optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    return {} if mask is None else {"throttle_reasons": throttle_names(mask)}


def nvlink_reading(nvml, handle) -> dict:
    """NVLink error counters summed over the device's active links (cumulative, since the
    driver loaded): {"nvlink_errors": {"crc_flit", "crc_data", "replay", "recovery"}}; absent
    without NVLink or when no counter is supported."""
    totals: dict[str, int] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            break  # no more links
        if state != nvml.NVML_FEATURE_ENABLED:
            continue
        for name, counter in NVLINK_COUNTERS.items():
            value = _count(_optional(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter))
            if value is not None:
                totals[name] = min(COUNTER_MAX, totals.get(name, 0) + value)
    return {"nvlink_errors": totals} if totals else {}


def device_health(nvml, handle) -> dict:
    """Every optional health reading of one device (the heartbeat's per-GPU fields beside
    temperature and PCIe width, which `worker_agent.inventory.read_gpus` reads)."""
    return (
        ecc_readings(nvml, handle)
        | retirement_readings(nvml, handle)
        | throttle_reading(nvml, handle)
        | nvlink_reading(nvml, handle)
    )


class XidWatcher:
    """Xid events (nvmlEventTypeXidCriticalError) of every device, read without waiting at each
    heartbeat: `register` once (a device that does not support events is left out), then
    `take()` drains what NVML queued since the last call, {uuid: [xid, ...]}.

    NVML keeps the events in its event set between calls, so an Xid between two heartbeats is
    reported by the next one; one raised while the agent was down is not (the driver's kernel
    log still has it)."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.event_set = None
        self.registered: set[str] = set()

    def register(self) -> None:
        nvml = self.nvml
        if self.event_set is None:
            self.event_set = _optional(nvml.nvmlEventSetCreate)
            if self.event_set is None:
                return
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            if uuid in self.registered:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self.event_set
                )
            except pynvml.NVMLError as exc:  # NotSupported (e.g. a MIG-enabled GPU on old drivers)
                log.debug("Xid events of %s not watched: %s", uuid, exc)
                continue
            self.registered.add(uuid)

    def take(self) -> dict[str, list[int]]:
        if self.event_set is None:
            self.register()
        if self.event_set is None:
            return {}
        seen: dict[str, list[int]] = {}
        for _ in range(1024):  # a storm of events is cut short, never an endless loop
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except pynvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing (more) queued
                break
            if int(data.eventType) != int(self.nvml.nvmlEventTypeXidCriticalError):
                continue
            uuid = _optional(self.nvml.nvmlDeviceGetUUID, data.device)
            if uuid is None:
                continue
            xids = seen.setdefault(_text(uuid), [])
            if len(xids) < XIDS_PER_READING:
                xids.append(max(0, min(int(data.eventData), 2**31 - 1)))
        return seen

    def close(self) -> None:
        if self.event_set is not None:
            _optional(self.nvml.nvmlEventSetFree, self.event_set)
            self.event_set = None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
