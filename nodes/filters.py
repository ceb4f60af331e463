"""The operators' node list filters (django-filter): state, condition, pool, GPU model, zone and
device health. The choices of pool, GPU model and zone are read from what exists, one query
each, so the form offers only values that match something."""

import django_filters
from django.db.models import Exists, OuterRef

from pools.models import ComputePool

from .choices import NodeState, Reachability
from .models import GpuDevice, Node

HEALTH_CHOICES = [("ok", "Every device healthy"), ("unhealthy", "A device unhealthy")]


class NodeFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(label="State", choices=NodeState.choices, empty_label="Any")
    condition = django_filters.ChoiceFilter(
        label="Condition",
        field_name="reachability",
        choices=Reachability.choices,
        empty_label="Any",
    )
    pool = django_filters.ChoiceFilter(label="Pool", field_name="pool__slug", empty_label="Any")
    gpu_model = django_filters.ChoiceFilter(
        label="GPU model", method="filter_gpu_model", empty_label="Any"
    )
    zone = django_filters.ChoiceFilter(label="Zone", empty_label="Any")
    health = django_filters.ChoiceFilter(
        label="Device health", choices=HEALTH_CHOICES, method="filter_health", empty_label="Any"
    )

    def __init__(self, *args, actor, **kwargs):
        super().__init__(*args, **kwargs)
        gpus = GpuDevice.objects.visible_to(actor)
        filters = self.filters
        filters["pool"].extra["choices"] = [
            (slug, slug)
            for slug in ComputePool.objects.visible_to(actor)
            .order_by("slug")
            .values_list("slug", flat=True)
        ]
        models = gpus.order_by("model").values_list("model", flat=True).distinct()
        filters["gpu_model"].extra["choices"] = [(m, m) for m in models]
        zones = (
            Node.objects.visible_to(actor)
            .exclude(zone="")
            .order_by("zone")
            .values_list("zone", flat=True)
            .distinct()
        )
        filters["zone"].extra["choices"] = [(z, z) for z in zones]

    def filter_gpu_model(self, queryset, name, value):
        return queryset.filter(Exists(GpuDevice.objects.filter(node=OuterRef("pk"), model=value)))

    def filter_health(self, queryset, name, value):
        unhealthy = Exists(GpuDevice.objects.filter(node=OuterRef("pk"), healthy=False))
        return queryset.filter(unhealthy) if value == "unhealthy" else queryset.exclude(unhealthy)
