from django.db import models


class TrustLevel(models.TextChoices):
    PRIVATE = "private", "Private fleet"
    MARKETPLACE = "marketplace", "Marketplace"


class TenantRole(models.TextChoices):
    MEMBER = "member", "Tenant member"
    ADMIN = "admin", "Tenant admin"


class PlatformRole(models.TextChoices):
    """Roles that are not bound to one tenant; held as Django groups of the same name."""

    OPERATOR = "operator", "Operator"
    POLICY_ADMIN = "policy_admin", "Policy admin"
    # defines the catalogue of shapes; changes no scheduling policy (quotas, priorities, ...)
    SHAPE_ADMIN = "shape_admin", "Shape admin"


class GpuSharingClass(models.TextChoices):
    NONE = "none", "No GPU"
    EXCLUSIVE = "exclusive", "Exclusive whole GPUs"
    MIG = "mig", "MIG slice (isolated)"
    TIMESLICE = "timeslice", "Time-sliced share (not isolated)"
    MPS = "mps", "MPS share (not isolated)"


# Isolated classes (memory and compute fenced by hardware) may mix tenants on one device.
ISOLATED_SHARING = frozenset({GpuSharingClass.EXCLUSIVE, GpuSharingClass.MIG})


class GpuSharingMode(models.TextChoices):
    """How a non-MIG device is offered; a MIG-enabled device offers MIG slices only."""

    EXCLUSIVE = "exclusive", "Whole device, one workload"
    TIMESLICE = "timeslice", "Time-sliced shares (not isolated)"
    MPS = "mps", "MPS shares (not isolated)"


class Architecture(models.TextChoices):
    AMD64 = "amd64", "x86-64"
    ARM64 = "arm64", "ARM64"


class ContainerRuntime(models.TextChoices):
    """What a job runs under on its node (docs/data-plane.md, "Runtimes"), weakest first."""

    PROCESS = "process", "Local process (no isolation; pools that allow it)"
    DOCKER = "docker", "Docker container (runc: the host's kernel)"
    GVISOR = "gvisor", "Docker container under gVisor (runsc: a kernel of its own)"


# How strongly each runtime isolates a job from its node: a pool's `required_runtime` admits a
# runtime at least this strong.
RUNTIME_STRENGTH = {runtime: rank for rank, runtime in enumerate(ContainerRuntime.values)}


class TokenScope(models.TextChoices):
    READ = "read", "Read (jobs, leases, pools: metadata)"
    LOGS_READ = "logs:read", "Read job logs"
    OUTPUTS_READ = "outputs:read", "Retrieve job outputs"
    WRITE = "write", "Write (submit, lease, cancel)"
    OPERATE = "operate", "Operate nodes (operators only)"
    # a Prometheus scrape token: GET /metrics and nothing else (operators only)
    METRICS_READ = "metrics:read", "Scrape /metrics (operators only)"


# Scopes only operators may hold.
OPERATOR_SCOPES = frozenset({TokenScope.OPERATE, TokenScope.METRICS_READ})


class SupportGrantState(models.TextChoices):
    """A tenant admin's grant to one operator to read the tenant's logs and outputs."""

    ACTIVE = "active", "Active"
    REVOKED = "revoked", "Revoked"
    EXPIRED = "expired", "Expired"


SUPPORT_GRANT_TRANSITIONS = {
    SupportGrantState.ACTIVE: frozenset({SupportGrantState.REVOKED, SupportGrantState.EXPIRED}),
}


class DrainPolicy(models.TextChoices):
    """What happens at a drain deadline to running work that cannot checkpoint (pool knob)."""

    FAIL = "fail", "Stop it: the job fails with reason drain_deadline"
    WAIT = "wait", "Let it run to its end; the node stays draining"
