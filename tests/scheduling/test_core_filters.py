"""Each filter of the scheduler core, accepted and rejected, with its reason code."""

from dataclasses import replace

import pytest

from scheduling.core import filters
from scheduling.core import reasons as r
from scheduling.core.types import GpuView, MigSlice, Policy, Request

from .core_factories import cpu_node, gpu_node

POLICY = Policy()


@pytest.mark.parametrize(
    ("request_kwargs", "node_kwargs", "reason"),
    [
        ({"node_pin": "other"}, {}, r.NODE_PIN_MISMATCH),
        ({}, {"state": "draining"}, "node_not_schedulable(draining)"),
        ({}, {"healthy": False}, "node_not_schedulable(unhealthy)"),
        ({"min_trust_level": 2}, {"trust_level": 1}, r.TRUST_LEVEL),
        ({"arch": "arm64"}, {"arch": "amd64"}, r.ARCH_MISMATCH),
        ({"image_archs": ("arm64",)}, {"arch": "amd64"}, r.IMAGE_ARCH_INCOMPATIBLE),
        ({"os": "windows"}, {}, r.OS_MISMATCH),
        ({"runtime": "podman"}, {"runtimes": frozenset({"docker"})}, r.RUNTIME_UNSUPPORTED),
        ({"regions": ("eu",)}, {"region": "us"}, r.REGION_EXCLUDED),
        ({"zones": ("eu-1",)}, {"zone": "eu-2"}, r.REGION_EXCLUDED),
        ({"network_class": "ib"}, {"network_class": "eth"}, r.NETWORK_CLASS_MISMATCH),
        ({"affinity": {"team": "a"}}, {"labels": {"team": "b"}}, r.AFFINITY_MISMATCH),
    ],
)
def test_static_filter_rejects_with_its_reason(request_kwargs, node_kwargs, reason):
    node = cpu_node(**node_kwargs)
    assert filters.static_reason(Request(**request_kwargs), node, POLICY) == reason


@pytest.mark.parametrize(
    ("request_kwargs", "node_kwargs"),
    [
        ({"node_pin": "cpu-1"}, {}),
        ({"min_trust_level": 1}, {"trust_level": 1}),
        ({"arch": "arm64", "image_archs": ("arm64", "amd64")}, {"arch": "arm64"}),
        ({"runtime": "podman"}, {"runtimes": frozenset({"docker", "podman"})}),
        ({"regions": ("eu",), "zones": ("eu-1",)}, {"region": "eu", "zone": "eu-1"}),
        ({"affinity": {"team": "a"}}, {"labels": {"team": "a", "x": "y"}}),
    ],
)
def test_static_filter_accepts_matching_node(request_kwargs, node_kwargs):
    assert filters.static_reason(Request(**request_kwargs), cpu_node(**node_kwargs)) is None


def test_gpu_request_on_cpu_node_is_insufficient_gpu():
    assert filters.static_reason(Request(gpu_count=1), cpu_node()) == r.INSUFFICIENT_GPU


def test_gpu_model_mismatch():
    req = Request(gpu_count=1, gpu_models=("H100-80GB",))
    assert filters.static_reason(req, gpu_node(model="A100-80GB")) == r.GPU_MODEL_MISMATCH
    assert filters.static_reason(req, gpu_node(model="H100-80GB")) is None


@pytest.mark.parametrize(
    ("field", "amount", "reason"),
    [
        ("cpu_millicores", 64001, r.INSUFFICIENT_CPU),
        ("memory_mib", 262145, r.INSUFFICIENT_MEMORY),
        ("scratch_mib", 1_000_001, r.INSUFFICIENT_SCRATCH),
    ],
)
def test_capacity_reason_at_the_boundary(field, amount, reason):
    node = gpu_node()
    assert filters.capacity_reason(Request(**{field: amount}), node) == reason
    assert filters.capacity_reason(Request(**{field: amount - 1}), node) is None


def test_anti_affinity_and_warm_image():
    node = cpu_node(workload_labels=frozenset({"app=db"}), warm_images=frozenset({"sha256:a"}))
    assert (
        filters.anti_affinity(Request(anti_affinity=("app=db",)), node, POLICY) == r.ANTI_AFFINITY
    )
    assert filters.anti_affinity(Request(anti_affinity=("app=web",)), node, POLICY) is None
    cold = Request(image="sha256:b", require_warm_image=True)
    assert filters.warm_image(cold, node, POLICY) == r.IMAGE_NOT_WARM
    assert filters.warm_image(replace(cold, image="sha256:a"), node, POLICY) is None
    assert filters.warm_image(replace(cold, require_warm_image=False), node, POLICY) is None


def test_gpu_memory_too_small():
    req = Request(gpu_count=1, gpu_memory_mib=40960)
    assert (
        filters.eligible_devices(req, gpu_node(memory_mib=24576), POLICY) == r.GPU_MEMORY_TOO_SMALL
    )
    assert len(filters.eligible_devices(req, gpu_node(memory_mib=81920), POLICY)) == 4


def test_driver_minimum():
    node = gpu_node(gpus=1)
    node = replace(
        node, gpus=(replace(node.gpus[0], driver_version="535.104", cuda_version="12.2"),)
    )
    assert filters.eligible_devices(
        Request(gpu_count=1, min_driver_version="550"), node, POLICY
    ) == (r.GPU_DRIVER_TOO_OLD)
    assert filters.eligible_devices(Request(gpu_count=1, min_cuda_version="12.1"), node, POLICY)


def test_fractional_share_needs_a_sharing_device():
    share = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    assert (
        filters.eligible_devices(share, gpu_node(sharing="exclusive"), POLICY)
        == r.GPU_SHARING_CLASS_UNAVAILABLE
    )
    assert filters.eligible_devices(share, gpu_node(sharing="timeslice"), POLICY)
    mps = replace(share, sharing="mps")
    assert (
        filters.eligible_devices(mps, gpu_node(sharing="timeslice"), POLICY)
        == r.GPU_SHARING_CLASS_UNAVAILABLE
    )


def test_mig_request_needs_mig_device_with_the_profile():
    req = Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb")
    plain = gpu_node(sharing="exclusive")
    assert filters.eligible_devices(req, plain, POLICY) == r.GPU_SHARING_CLASS_UNAVAILABLE
    assert filters.eligible_devices(req, gpu_node(sharing="mig"), POLICY)
    a100_40 = gpu_node(sharing="mig", model="A100-40GB", memory_mib=40960)
    assert filters.eligible_devices(req, a100_40, POLICY)  # 1g.10gb exists on A100-40GB too
    big = replace(req, mig_profile="1g.20gb")  # only on 80 GB devices
    assert filters.eligible_devices(big, a100_40, POLICY) == r.GPU_SHARING_CLASS_UNAVAILABLE


def test_mig_device_full_is_insufficient():
    full = GpuView(0, model="A100-80GB", sharing="mig", mig_slices=(MigSlice("7g.80gb", 0),))
    node = replace(gpu_node(sharing="mig", gpus=1), gpus=(full,))
    req = Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb")
    assert filters.eligible_devices(req, node, POLICY) == r.INSUFFICIENT_GPU


def test_whole_gpu_needs_fully_free_devices():
    node = gpu_node(gpus=2, sharing="timeslice")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=900), node.gpus[1]))
    assert len(filters.eligible_devices(Request(gpu_count=1), node, POLICY)) == 1
    assert filters.eligible_devices(Request(gpu_count=2), node, POLICY) == r.INSUFFICIENT_GPU


def test_unhealthy_devices_are_excluded_with_their_reason():
    node = gpu_node(gpus=2)
    sick = (
        replace(node.gpus[0], healthy=False),
        replace(node.gpus[1], health_flags=("xid_error",)),
    )
    node = replace(node, gpus=sick)
    assert filters.eligible_devices(Request(gpu_count=1), node, POLICY) == r.DEVICE_UNHEALTHY


def test_non_isolated_sharing_refuses_other_tenants_unless_policy_allows():
    node = gpu_node(gpus=1, sharing="mps")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=600, tenants=("acme",)),))
    req = Request(gpu_count=1, gpu_milli=300, sharing="mps", tenant="globex")
    assert filters.eligible_devices(req, node, POLICY) == r.TENANT_MIXING_REFUSED
    assert filters.eligible_devices(req, node, Policy(allow_tenant_mixing=True))
    assert filters.eligible_devices(replace(req, tenant="acme"), node, POLICY)
