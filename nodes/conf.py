"""The nodes app's settings, each with its default; read at call time, never at import."""

from datetime import timedelta

from django.conf import settings

DEFAULTS = {
    "NODE_CREDENTIAL_TTL": timedelta(days=30),
    "NODE_CREDENTIAL_OVERLAP": timedelta(minutes=10),
    "NODE_MISSED_HEARTBEATS": 3,  # unreachable after this many intervals of silence
    "NODE_GPU_MAX_TEMPERATURE_C": 90,  # when NVML gives no slowdown threshold
    # Device health rules (nodes/health_rules.py, docs/nodes.md "Device health"). Xids that
    # mean the device (not a job's code) failed: double-bit ECC (48), internal micro-controller
    # breakpoint/halt (61, 62), ECC page retirement or row remap recording failure (64),
    # NVLink error (74), fallen off the bus (79), high single-bit ECC rate (92), contained and
    # uncontained ECC errors (94, 95), GSP errors (119, 120), unrecovered ECC (140). Xids a job
    # can cause (13, 31, 43, 45, 68, 69) are left out: a tenant could take devices away.
    "NODE_GPU_CRITICAL_XIDS": (48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140),
    "NODE_GPU_ECC_AGGREGATE_UNCORRECTED_MAX": 10,  # in the device's life
    "NODE_GPU_RETIRED_PAGES_MAX": 60,  # NVIDIA retires at most 64 pages before an RMA
    "NODE_GPU_NVLINK_CRC_PER_S_MAX": 100.0,  # CRC flit + data errors per second (DCGM's)
    "NODE_GPU_NVLINK_REPLAY_PER_S_MAX": 10.0,  # replays per second
    "NODE_DRIFT_LARGE_PERCENT": 10,  # CPU or memory shrinking more than this quarantines
    "NODE_PROBE_MEMORY_TOLERANCE_PERCENT": 5,  # a container sees a little less than the host
    # The validation probe's challenge (nodes/challenge.py): the image it runs in (a tag is
    # pinned to its digest when the probe is requested), the seeded work and its time budget.
    "NODE_PROBE_IMAGE": "127.0.0.1:5000/computepool/busybox:test",
    "NODE_PROBE_ITERATIONS": 300,  # sha256 rounds per chain
    "NODE_PROBE_WORKERS_MAX": 16,  # parallel chains: one per claimed CPU, at most this many
    "NODE_PROBE_MEMORY_MAX_MIB": 2048,  # the claimed memory is proven up to this much
    "NODE_PROBE_SECONDS_PER_ITERATION": 0.05,  # generous: far beyond a busybox sha256 round
    "NODE_PROBE_SECONDS_BASE": 60,  # container start, the memory fill, a slow disk
    # the GPU challenge (docs/nodes.md "GPU challenge"): the image its container runs in
    # (python3 ≥ 3.9 and glibc, e.g. python:3.12-slim; the agent's package is mounted into it;
    # "": none, and only agents without a container runtime can answer), the claimed memory
    # left to the driver and the context, the words read back, the FMA kernel's length at the
    # claimed class, the model assumed where no class is known
    "NODE_GPU_PROBE_IMAGE": "",
    "NODE_GPU_CHALLENGE_RESERVE_MIB": 2048,
    "NODE_GPU_CHALLENGE_SAMPLES": 64,
    "NODE_GPU_CHALLENGE_FMA_SECONDS": 0.5,
    "NODE_GPU_CHALLENGE_UNCLASSED_GFLOPS": 5000,
    "NODE_IMAGE_PULL_TIMES_MAX": 512,  # pull times kept per node (newest win)
    "NODE_INPUT_DOWNLOAD_TIMES_MAX": 512,  # input download times kept per node (newest win)
}


def setting(name: str):
    return getattr(settings, name, DEFAULTS[name])
