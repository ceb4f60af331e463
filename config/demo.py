"""An idempotent demo: one pool, two tenants, shapes, priority classes, people and nodes.

Loading it twice changes nothing; everything is created through the services, so the demo's
nodes and policy have events and versions like real ones.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from nodes.choices import NodeState
from nodes.models import Node
from nodes.services import node_mark_ready, node_register, node_verify
from pools.actors import Actor
from pools.choices import GpuSharingClass, PlatformRole, TenantRole
from pools.models import AllowedRegistry, ComputePool, PriorityClass, Quota, ResourceShape, Tenant
from pools.services import membership_set, platform_role_grant, pool_create

POOL = {"slug": "lab", "name": "Lab fleet", "description": "Demo private fleet"}
TENANTS = [("vision", "Vision research"), ("nlp", "Language team")]
PEOPLE = [
    # username, password, tenant roles, platform roles
    ("alice", "alice-demo-pass", {"vision": TenantRole.MEMBER}, []),
    ("bob", "bob-demo-pass", {"nlp": TenantRole.ADMIN}, []),
    ("olga", "olga-demo-pass", {}, [PlatformRole.OPERATOR]),
    ("paula", "paula-demo-pass", {}, [PlatformRole.POLICY_ADMIN]),
]
PRIORITIES = [
    # name, value, preemptible, description, minimum tenant role to submit at it
    ("production", 1000, False, "Serving and deadlines", TenantRole.ADMIN),
    ("batch", 100, True, "Default for training and batch", TenantRole.MEMBER),
    ("scavenger", 0, True, "Runs on leftovers, preempted first", TenantRole.MEMBER),
]
SHAPES = [
    dict(
        name="cpu-small",
        cpu_millicores_min=1000,
        memory_mib_min=2048,
        cpu_millicores_preferred=2000,
        memory_mib_preferred=4096,
    ),
    dict(name="cpu-large", cpu_millicores_min=8000, memory_mib_min=32768, scratch_mib=50_000),
    dict(
        name="gpu-a100-1",
        cpu_millicores_min=8000,
        memory_mib_min=65536,
        gpu_count=1,
        gpu_models=["A100"],
        gpu_memory_mib_min=40960,
        gpu_sharing_class=GpuSharingClass.EXCLUSIVE,
    ),
    dict(
        name="gpu-mig-1g",
        cpu_millicores_min=2000,
        memory_mib_min=8192,
        gpu_count=1,
        gpu_models=["A100"],
        gpu_sharing_class=GpuSharingClass.MIG,
        mig_profile="1g.10gb",
    ),
    dict(
        name="gpu-share-quarter",
        cpu_millicores_min=2000,
        memory_mib_min=8192,
        gpu_count=1,
        gpu_models=["T4"],
        gpu_sharing_class=GpuSharingClass.TIMESLICE,
        gpu_milli=250,
    ),
]


def _gpus(model: str, count: int, memory_mib: int, node: str, *, mig: bool = False):
    return [
        dict(
            index=i,
            uuid=f"GPU-demo-{node}-{i}",
            model=model,
            memory_mib=memory_mib,
            driver_version="550.54",
            cuda_version="12.4",
            mig_enabled=mig,
            interconnect_group=f"{node}-nvl0" if count > 1 else "",
            numa_node=i * 2 // count,
        )
        for i in range(count)
    ]


NODES = [
    dict(name="cpu-01", cpu_millicores=32000, memory_mib=131072, scratch_mib=500_000, gpus=[]),
    dict(name="cpu-02", cpu_millicores=32000, memory_mib=131072, scratch_mib=500_000, gpus=[]),
    dict(name="ram-01", cpu_millicores=64000, memory_mib=1048576, scratch_mib=200_000, gpus=[]),
    dict(
        name="gpu-a100-01",
        cpu_millicores=64000,
        memory_mib=524288,
        scratch_mib=2_000_000,
        gpus=_gpus("A100", 4, 81920, "gpu-a100-01"),
    ),
    dict(
        name="gpu-a100-mig-01",
        cpu_millicores=64000,
        memory_mib=524288,
        scratch_mib=1_000_000,
        gpus=_gpus("A100", 2, 40960, "gpu-a100-mig-01", mig=True),
    ),
    dict(
        name="gpu-t4-01",
        cpu_millicores=16000,
        memory_mib=65536,
        scratch_mib=200_000,
        gpus=[g | {"sharing_mode": "timeslice"} for g in _gpus("T4", 2, 15360, "gpu-t4-01")],
    ),
]


@transaction.atomic
def load_demo() -> list[tuple[str, str, str]]:
    """Create what is missing; return (username, password, roles) for the printout."""
    actor = Actor.system("demo")
    pool = ComputePool.objects.filter(slug=POOL["slug"]).first() or pool_create(**POOL)
    AllowedRegistry.objects.get_or_create(pool=pool, prefix="127.0.0.1:5000/computepool/")
    tenants = {}
    for slug, name in TENANTS:
        tenants[slug], _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
        Quota.objects.get_or_create(
            tenant=tenants[slug],
            pool=pool,
            defaults={"cpu_millicores": 64000, "memory_mib": 262144, "gpus": 4},
        )
    for name, value, preemptible, description, minimum_role in PRIORITIES:
        PriorityClass.objects.update_or_create(
            name=name,
            defaults={
                "value": value,
                "preemptible": preemptible,
                "description": description,
                "minimum_role": minimum_role,
            },
        )
    for shape in SHAPES:
        ResourceShape.objects.update_or_create(
            pool=pool, name=shape["name"], defaults={k: v for k, v in shape.items() if k != "name"}
        )
    printout = []
    User = get_user_model()
    for username, password, memberships, platform_roles in PEOPLE:
        user, created = User.objects.get_or_create(username=username)
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        for tenant_slug, role in memberships.items():
            membership_set(user=user, tenant=tenants[tenant_slug], role=role)
        for role in platform_roles:
            platform_role_grant(user=user, role=role)
        roles = [f"{role} of {t}" for t, role in memberships.items()] + list(platform_roles)
        printout.append((username, password, ", ".join(roles)))
    for spec in NODES:
        if Node.objects.filter(pool=pool, name=spec["name"]).exists():
            continue
        node = node_register(
            pool=pool,
            actor=actor,
            region="eu-west",
            zone="eu-west-1a",
            rack="r1",
            network_class="25g",
            runtimes=["docker"],
            **spec,
        )
        node = node_verify(node=node, actor=actor, message="demo node")
        if node.state == NodeState.VERIFIED:
            node_mark_ready(node=node, actor=actor, message="demo node")
    return printout
