"""What a pool offers to ask for: resource shapes (the fields of a request) and priority
classes."""

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from ..choices import Architecture, ContainerRuntime, GpuSharingClass, TenantRole
from ..roles import tenant_roles
from ..validation import shape_errors
from ..visibility import Visibility, VisibleQuerySet
from .tenancy import ComputePool, Tenant

# The fields of a shape that make up a resource request (inline requests use the same ones).
REQUEST_FIELDS = (
    "cpu_millicores_min",
    "cpu_millicores_preferred",
    "memory_mib_min",
    "memory_mib_preferred",
    "gpu_count",
    "gpu_models",
    "gpu_memory_mib_min",
    "gpu_sharing_class",
    "gpu_milli",
    "mig_profile",
    "scratch_mib",
    "network_class",
    "architecture",
    "os",
    "container_runtime",
    "regions",
    "zones",
    "node_pin",
    # preferences and minimums (docs/scheduler.md "Shapes"): each reaches the core's Request
    "gpu_count_preferred",
    "gpu_memory_mib_preferred",
    "gpu_driver_version_min",
    "gpu_cuda_version_min",
    "gpu_interconnect_required",
    "regions_preferred",
    "zones_preferred",
    "warm_image_required",
    "trust_level_min",
    "gpu_compute_capability_min",
    "node_features_required",
)


class ResourceShape(models.Model):
    """A catalogue entry: what a workload needs, never which machine it runs on."""

    objects = VisibleQuerySet.as_manager()
    visibility = Visibility(public=True)

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="shapes")
    name = models.SlugField(max_length=60)
    description = models.CharField(max_length=200, blank=True)
    cpu_millicores_min = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    cpu_millicores_preferred = models.PositiveIntegerField(null=True, blank=True)
    memory_mib_min = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_mib_preferred = models.PositiveIntegerField(null=True, blank=True)
    gpu_count = models.PositiveSmallIntegerField(default=0)
    gpu_models = models.JSONField(default=list, blank=True, help_text="Accepted GPU models/classes")
    gpu_memory_mib_min = models.PositiveIntegerField(default=0)
    gpu_sharing_class = models.CharField(
        max_length=10, choices=GpuSharingClass.choices, default=GpuSharingClass.NONE
    )
    gpu_milli = models.PositiveSmallIntegerField(
        default=0, help_text="Share of one GPU in thousandths (time-slicing and MPS only)"
    )
    mig_profile = models.CharField(max_length=20, blank=True, help_text='e.g. "1g.10gb"')
    scratch_mib = models.PositiveIntegerField(default=0)
    network_class = models.CharField(max_length=40, blank=True)
    architecture = models.CharField(
        max_length=10, choices=Architecture.choices, default=Architecture.AMD64
    )
    os = models.CharField(max_length=20, default="linux")
    container_runtime = models.CharField(
        max_length=30, choices=ContainerRuntime.choices, default=ContainerRuntime.DOCKER
    )
    regions = models.JSONField(default=list, blank=True)
    zones = models.JSONField(default=list, blank=True)
    node_pin = models.CharField(max_length=100, blank=True, help_text="Hard pin to a node name")
    gpu_count_preferred = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="More GPUs when a node has them; the count is the minimum"
    )
    gpu_memory_mib_preferred = models.PositiveIntegerField(
        null=True, blank=True, help_text="Devices with this much memory when there are"
    )
    gpu_driver_version_min = models.CharField(
        max_length=20, blank=True, help_text='The oldest driver it runs on, e.g. "535.104"'
    )
    gpu_cuda_version_min = models.CharField(
        max_length=20, blank=True, help_text='The oldest CUDA it runs on, e.g. "12.2"'
    )
    gpu_interconnect_required = models.BooleanField(
        default=False, help_text="Several GPUs: all in one NVLink/NVSwitch group"
    )
    regions_preferred = models.JSONField(default=list, blank=True)
    zones_preferred = models.JSONField(default=list, blank=True)
    warm_image_required = models.BooleanField(
        default=False, help_text="Only nodes that already hold the job's image (local data)"
    )
    trust_level_min = models.PositiveSmallIntegerField(
        default=0, help_text="Only nodes of at least this trust level"
    )
    gpu_compute_capability_min = models.CharField(
        max_length=7,
        blank=True,
        help_text='GPUs of this CUDA compute capability or higher, e.g. "8.0"',
    )
    node_features_required = models.JSONField(
        default=list,
        blank=True,
        help_text='Only nodes whose agent reports all these features, e.g. ["avx512"]',
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="shape_name_unique_in_pool"),
            models.CheckConstraint(
                condition=Q(cpu_millicores_preferred__isnull=True)
                | Q(cpu_millicores_preferred__gte=models.F("cpu_millicores_min")),
                name="shape_cpu_preferred_gte_min",
            ),
            models.CheckConstraint(
                condition=Q(memory_mib_preferred__isnull=True)
                | Q(memory_mib_preferred__gte=models.F("memory_mib_min")),
                name="shape_memory_preferred_gte_min",
            ),
            models.CheckConstraint(
                condition=Q(gpu_count_preferred__isnull=True)
                | Q(gpu_count_preferred__gte=models.F("gpu_count")),
                name="shape_gpu_count_preferred_gte_min",
            ),
            models.CheckConstraint(
                condition=Q(gpu_memory_mib_preferred__isnull=True)
                | Q(gpu_memory_mib_preferred__gte=models.F("gpu_memory_mib_min")),
                name="shape_gpu_memory_preferred_gte_min",
            ),
        ]

    def __str__(self):
        return f"{self.pool.slug}/{self.name}"

    def as_request(self) -> dict:
        return {field: getattr(self, field) for field in REQUEST_FIELDS}

    def clean(self):
        errors = shape_errors(self)
        sharing = self.gpu_sharing_class
        if sharing == GpuSharingClass.NONE and self.gpu_count:
            errors["gpu_sharing_class"] = "A shape with GPUs needs a sharing class."
        if sharing != GpuSharingClass.NONE and not self.gpu_count:
            errors["gpu_count"] = "A GPU sharing class needs at least one GPU."
        if sharing in (GpuSharingClass.TIMESLICE, GpuSharingClass.MPS):
            if not 0 < self.gpu_milli < 1000:
                errors["gpu_milli"] = "Shared classes take a share between 1 and 999 thousandths."
            if self.gpu_count != 1:
                errors["gpu_count"] = "A shared-GPU shape takes a share of exactly one GPU."
        elif self.gpu_milli:
            errors["gpu_milli"] = "Only time-slicing and MPS take a fractional share."
        if sharing == GpuSharingClass.MIG and not self.mig_profile:
            errors["mig_profile"] = "A MIG shape names its profile, e.g. 1g.10gb."
        if sharing != GpuSharingClass.MIG and self.mig_profile:
            errors["mig_profile"] = "Only MIG shapes name a profile."
        gpu_only = (
            "gpu_count_preferred",
            "gpu_memory_mib_preferred",
            "gpu_driver_version_min",
            "gpu_cuda_version_min",
            "gpu_interconnect_required",
            "gpu_compute_capability_min",
        )
        if not self.gpu_count:
            for name in gpu_only:
                if getattr(self, name):
                    errors[name] = "Only a shape with GPUs names it."
        if self.gpu_interconnect_required and self.gpu_count < 2:
            errors["gpu_interconnect_required"] = "An interconnect joins two GPUs or more."
        if self.container_runtime == ContainerRuntime.GVISOR and self.gpu_count:
            # Debian's runsc (2022) has no GPU proxy: a device handed to the sandbox is unusable
            errors["container_runtime"] = "gVisor runs CPU work only: no GPUs under it."
        if errors:
            raise ValidationError(errors)


class PriorityClassQuerySet(VisibleQuerySet):
    def allowed_to(self, user, tenant):
        """The classes `user` may submit at for `tenant`: the one check point for priorities."""
        role = tenant_roles(user).get(tenant.pk)
        if role is None:
            return self.none()
        # No tenants listed means every tenant; a (class, tenant) pair joins at most one row.
        allowed = self.filter(Q(allowed_tenants__isnull=True) | Q(allowed_tenants=tenant))
        if role != TenantRole.ADMIN:
            allowed = allowed.filter(minimum_role=TenantRole.MEMBER)
        return allowed


class PriorityClass(models.Model):
    objects = PriorityClassQuerySet.as_manager()
    visibility = Visibility(public=True)

    name = models.SlugField(max_length=40, unique=True)
    value = models.IntegerField(help_text="Higher runs first")
    preemptible = models.BooleanField(
        default=True, help_text="Its checkpointable running jobs may be preempted"
    )
    may_preempt = models.BooleanField(
        default=False, help_text="Its queued jobs may preempt jobs of lower, preemptible classes"
    )
    max_wait_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Target: a job of this class waits at most this long"
    )
    description = models.CharField(max_length=200, blank=True)
    allowed_tenants = models.ManyToManyField(
        Tenant, blank=True, related_name="+", help_text="Only these tenants; none: every tenant"
    )
    minimum_role = models.CharField(
        max_length=10,
        choices=TenantRole.choices,
        default=TenantRole.MEMBER,
        help_text="Tenant admin: only a tenant's admins may submit at this class",
    )

    class Meta:
        ordering = ["-value"]
        verbose_name_plural = "priority classes"

    def __str__(self):
        return f"{self.name} ({self.value})"
