"""Device eligibility: which GPUs can take one share of a request, or the reason none can."""

from dataclasses import replace

from placement import reasons as r
from placement.devices import eligible_devices
from placement.types import GpuView, MigSlice, Policy, Request

from .factories import gpu_node

POLICY = Policy()


def test_gpu_memory_too_small():
    req = Request(gpu_count=1, gpu_memory_mib=40960)
    assert eligible_devices(req, gpu_node(memory_mib=24576), POLICY) == r.GPU_MEMORY_TOO_SMALL
    assert len(eligible_devices(req, gpu_node(memory_mib=81920), POLICY)) == 4


def test_driver_minimum():
    node = gpu_node(gpus=1)
    node = replace(
        node, gpus=(replace(node.gpus[0], driver_version="535.104", cuda_version="12.2"),)
    )
    assert eligible_devices(Request(gpu_count=1, min_driver_version="550"), node, POLICY) == (
        r.GPU_DRIVER_TOO_OLD
    )
    assert eligible_devices(Request(gpu_count=1, min_cuda_version="12.1"), node, POLICY)


def test_fractional_share_needs_a_sharing_device():
    share = Request(gpu_count=1, gpu_milli=500, sharing="timeslice")
    assert (
        eligible_devices(share, gpu_node(sharing="exclusive"), POLICY)
        == r.GPU_SHARING_CLASS_UNAVAILABLE
    )
    assert eligible_devices(share, gpu_node(sharing="timeslice"), POLICY)
    mps = replace(share, sharing="mps")
    assert (
        eligible_devices(mps, gpu_node(sharing="timeslice"), POLICY)
        == r.GPU_SHARING_CLASS_UNAVAILABLE
    )


def test_mig_request_needs_mig_device_with_the_profile():
    req = Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb")
    plain = gpu_node(sharing="exclusive")
    assert eligible_devices(req, plain, POLICY) == r.GPU_SHARING_CLASS_UNAVAILABLE
    assert eligible_devices(req, gpu_node(sharing="mig"), POLICY)
    a100_40 = gpu_node(sharing="mig", model="A100-40GB", memory_mib=40960)
    assert eligible_devices(req, a100_40, POLICY)  # 1g.10gb exists on A100-40GB too
    big = replace(req, mig_profile="1g.20gb")  # only on 80 GB devices
    assert eligible_devices(big, a100_40, POLICY) == r.GPU_SHARING_CLASS_UNAVAILABLE


def test_mig_device_full_is_insufficient():
    full = GpuView(0, model="A100-80GB", sharing="mig", mig_slices=(MigSlice("7g.80gb", 0),))
    node = replace(gpu_node(sharing="mig", gpus=1), gpus=(full,))
    req = Request(gpu_count=1, sharing="mig", mig_profile="1g.10gb")
    assert eligible_devices(req, node, POLICY) == r.INSUFFICIENT_GPU


def test_whole_gpu_needs_fully_free_devices():
    node = gpu_node(gpus=2, sharing="timeslice")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=900), node.gpus[1]))
    assert len(eligible_devices(Request(gpu_count=1), node, POLICY)) == 1
    assert eligible_devices(Request(gpu_count=2), node, POLICY) == r.INSUFFICIENT_GPU


def test_unhealthy_devices_are_excluded_with_their_reason():
    node = gpu_node(gpus=2)
    sick = (
        replace(node.gpus[0], healthy=False),
        replace(node.gpus[1], health_flags=("xid_error",)),
    )
    node = replace(node, gpus=sick)
    assert eligible_devices(Request(gpu_count=1), node, POLICY) == r.DEVICE_UNHEALTHY


def test_non_isolated_sharing_refuses_other_tenants_unless_policy_allows():
    node = gpu_node(gpus=1, sharing="mps")
    node = replace(node, gpus=(replace(node.gpus[0], free_milli=600, tenants=("acme",)),))
    req = Request(gpu_count=1, gpu_milli=300, sharing="mps", tenant="globex")
    assert eligible_devices(req, node, POLICY) == r.TENANT_MIXING_REFUSED
    assert eligible_devices(req, node, Policy(allow_tenant_mixing=True))
    assert eligible_devices(replace(req, tenant="acme"), node, POLICY)
