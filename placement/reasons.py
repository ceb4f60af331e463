"""Catalogue of placement rejection reasons.

Every filter rejects a node with exactly one of these codes (the first failing check), so an
explanation can count nodes per reason. Codes are stable strings: they are stored in decision
records and shown to users, so never rename one; add new ones instead.
"""

INSUFFICIENT_CPU = "insufficient_cpu"
INSUFFICIENT_MEMORY = "insufficient_memory"
INSUFFICIENT_SCRATCH = "insufficient_scratch"
INSUFFICIENT_GPU = "insufficient_gpu"
GPU_MODEL_MISMATCH = "gpu_model_mismatch"
GPU_MEMORY_TOO_SMALL = "gpu_memory_too_small"
GPU_SHARING_CLASS_UNAVAILABLE = "gpu_sharing_class_unavailable"
GPU_DRIVER_TOO_OLD = "gpu_driver_too_old"
GPU_COMPUTE_CAPABILITY_TOO_LOW = "gpu_compute_capability_too_low"
DEVICE_UNHEALTHY = "device_unhealthy"
ARCH_MISMATCH = "arch_mismatch"
OS_MISMATCH = "os_mismatch"
RUNTIME_UNSUPPORTED = "runtime_unsupported"
REGION_EXCLUDED = "region_excluded"
NETWORK_CLASS_MISMATCH = "network_class_mismatch"
NODE_FEATURE_MISSING = "node_feature_missing"
NODE_NOT_SCHEDULABLE = "node_not_schedulable"
NODE_UNREACHABLE = "node_unreachable"
NODE_PIN_MISMATCH = "node_pin_mismatch"
AFFINITY_MISMATCH = "affinity_mismatch"
ANTI_AFFINITY = "anti_affinity"
TRUST_LEVEL = "trust_level"
IMAGE_ARCH_INCOMPATIBLE = "image_arch_incompatible"
IMAGE_NOT_WARM = "image_not_warm"
TENANT_MIXING_REFUSED = "tenant_mixing_refused"
INTERCONNECT_UNAVAILABLE = "interconnect_unavailable"
NUMA_UNAVAILABLE = "numa_unavailable"
GANG_UNPLACEABLE = "gang_unplaceable"
INVALID_REQUEST = "invalid_request"

#: Human wording, used by explanations ("12 node_not_schedulable(draining)" stays the code form).
DESCRIPTIONS: dict[str, str] = {
    INSUFFICIENT_CPU: "not enough free CPU",
    INSUFFICIENT_MEMORY: "not enough free memory",
    INSUFFICIENT_SCRATCH: "not enough free scratch disk",
    INSUFFICIENT_GPU: "not enough free GPU capacity",
    GPU_MODEL_MISMATCH: "GPU model not in the requested list",
    GPU_MEMORY_TOO_SMALL: "GPU memory smaller than requested",
    GPU_SHARING_CLASS_UNAVAILABLE: "no GPU offers the requested sharing class or MIG profile",
    GPU_DRIVER_TOO_OLD: "GPU driver or CUDA version below the requested minimum",
    GPU_COMPUTE_CAPABILITY_TOO_LOW: "no GPU of the requested compute capability or higher",
    DEVICE_UNHEALTHY: "GPUs that would fit are unhealthy",
    ARCH_MISMATCH: "CPU architecture differs",
    OS_MISMATCH: "operating system differs",
    RUNTIME_UNSUPPORTED: "container runtime not offered",
    REGION_EXCLUDED: "region or zone not allowed",
    NETWORK_CLASS_MISMATCH: "network class differs",
    NODE_FEATURE_MISSING: "node lacks a required feature",
    NODE_NOT_SCHEDULABLE: "node is not accepting work",
    NODE_UNREACHABLE: "node missed its heartbeats (unreachable)",
    NODE_PIN_MISMATCH: "request is pinned to another node",
    AFFINITY_MISMATCH: "node labels do not match the required affinity",
    ANTI_AFFINITY: "node runs work the request must avoid",
    TRUST_LEVEL: "node trust level below the requirement",
    IMAGE_ARCH_INCOMPATIBLE: "image not built for the node architecture",
    IMAGE_NOT_WARM: "image not cached on the node and the shape requires a warm cache",
    TENANT_MIXING_REFUSED: "shared GPUs are used by another tenant",
    INTERCONNECT_UNAVAILABLE: "not enough free GPUs in one interconnect group",
    NUMA_UNAVAILABLE: "not enough CPU/memory on the GPUs' NUMA node",
    GANG_UNPLACEABLE: "the replicas cannot all be placed together",
    INVALID_REQUEST: "the request is inconsistent",
}

ALL_REASONS: frozenset[str] = frozenset(DESCRIPTIONS)
