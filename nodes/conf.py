"""The nodes app's settings, each with its default; read at call time, never at import."""

from datetime import timedelta

from django.conf import settings

DEFAULTS = {
    "NODE_CREDENTIAL_TTL": timedelta(days=30),
    "NODE_CREDENTIAL_OVERLAP": timedelta(minutes=10),
    "NODE_MISSED_HEARTBEATS": 3,  # unreachable after this many intervals of silence
    "NODE_GPU_MAX_TEMPERATURE_C": 90,  # when NVML gives no slowdown threshold
    "NODE_DRIFT_LARGE_PERCENT": 10,  # CPU or memory shrinking more than this quarantines
    "NODE_PROBE_MEMORY_TOLERANCE_PERCENT": 5,  # a container sees a little less than the host
}


def setting(name: str):
    return getattr(settings, name, DEFAULTS[name])
