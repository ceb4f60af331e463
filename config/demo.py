"""An idempotent demo: the pool `lab` (Docker runtime) and the development pool `dev` (the
local process runtime allowed), two tenants, shapes, priority classes, people, and example nodes.

Loading it twice changes nothing; everything is built by config.builders (through the services,
like the tests' state), so the demo's nodes and policy have events and versions like real ones.
The example nodes are registered, never ready: no agent runs them, and a node without a running
agent must never receive work. `make run` starts one real agent (config/management/commands/
runstack.py), enrolled with a token from `agent_enrollment_token`; its node becomes ready on its
first heartbeat.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from config.builders import build_node, build_person, build_pool, build_tenant
from nodes import services as node_services
from nodes.choices import NodeState
from nodes.models import Node
from pools.actors import Actor
from pools.choices import ContainerRuntime, GpuSharingClass, PlatformRole, TenantRole
from pools.models import ComputePool, PriorityClass, Quota, ResourceShape, Tenant
from pools.services import policy_version_publish

POOL = {"slug": "lab", "name": "Lab fleet", "description": "Demo private fleet"}
# Where `make run`'s agent goes when no Docker engine answers: the only demo pool whose policy
# allows the local process runtime, which does NOT isolate jobs (never a default).
DEV_POOL = {
    "slug": "dev",
    "name": "Development",
    "description": "Local process runtime (no isolation): for trying Compute Pool without Docker",
}
# The process runtime cannot bound a job's disk, so the dev pool's jobs get no output limit by
# default (0); the lab's get a 256 MiB /outputs filesystem (docs/data-plane.md, "Disk limits").
DEV_KNOBS = {"allow_process_runtime": True, "output_limit_mib": 0}
# The demo's published ports are reached from this machine only (jobs/networks.py).
LAB_KNOBS = {
    "ingress_address": "127.0.0.1",
    "output_limit_mib": 256,
    "default_priority_class": "batch",  # a job that names no class is never below scavenger
}
DEV_SHAPE_FIELDS = {"container_runtime": "process"}
# The loopback registry (.ci/ensure-services.sh runs one with the busybox test image): every
# repository in it is allowed, so a newcomer may push and run images of their own.
REGISTRY = "127.0.0.1:5000/"
TENANTS = [("vision", "Vision research"), ("nlp", "Language team")]
PEOPLE = [
    # username, password, tenant roles, platform roles
    ("alice", "alice-demo-pass", {"vision": TenantRole.MEMBER}, []),
    ("bob", "bob-demo-pass", {"nlp": TenantRole.ADMIN}, []),
    ("olga", "olga-demo-pass", {}, [PlatformRole.OPERATOR]),
    ("paula", "paula-demo-pass", {}, [PlatformRole.POLICY_ADMIN]),
    ("sasha", "sasha-demo-pass", {}, [PlatformRole.SHAPE_ADMIN]),
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
    # untrusted code: the same CPU shape under gVisor (a node whose dockerd has runsc)
    dict(
        name="cpu-small-gvisor",
        cpu_millicores_min=1000,
        memory_mib_min=2048,
        container_runtime=ContainerRuntime.GVISOR,
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


# Nodes as an operator registers them; each GPU dict holds config.builders.gpu() fields.
A100 = {"model": "A100", "memory_mib": 81920, "driver_version": "550.54"}
NODES = [
    dict(name="cpu-01", cpu=32000, memory=131072, scratch=500_000),
    dict(name="cpu-02", cpu=32000, memory=131072, scratch=500_000),
    dict(name="ram-01", cpu=64000, memory=1048576, scratch=200_000),
    dict(name="gpu-a100-01", cpu=64000, memory=524288, scratch=2_000_000, gpus=[A100] * 4),
    dict(
        name="gpu-a100-mig-01",
        cpu=64000,
        memory=524288,
        scratch=1_000_000,
        gpus=[A100 | {"memory_mib": 40960, "mig_enabled": True}] * 2,
    ),
    dict(
        name="gpu-t4-01",
        cpu=16000,
        memory=65536,
        scratch=200_000,
        gpus=[A100 | {"model": "T4", "memory_mib": 15360, "sharing_mode": "timeslice"}] * 2,
    ),
]
# Where the demo's nodes stand.
PLACE = dict(region="eu-west", zone="eu-west-1a", rack="r1", network_class="25g")
ACTOR = Actor.system("demo")


def ensure_priority_classes() -> None:
    """The demo's priority classes (a pool's policy names them), made or brought up to date."""
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


def _demo_pool(fields: dict, knobs: dict, comment: str) -> ComputePool:
    """The pool, with a new policy version when the current one lacks any of `knobs` (an
    operator's own values of them are kept)."""
    pool = ComputePool.objects.filter(slug=fields["slug"]).first()
    if pool is None:
        pool = build_pool(**fields, registry=REGISTRY)
    current = pool.scheduling_policy.current
    have = dict(current.knobs or {})
    if any(name not in have for name in knobs):
        policy_version_publish(
            policy=pool.scheduling_policy,
            weights=dict(current.weights),
            knobs=knobs | have,
            comment=comment,
            actor=ACTOR,
        )
    return pool


@transaction.atomic
def load_demo() -> list[tuple[str, str, str]]:
    """Create what is missing; return (username, password, roles) for the printout."""
    actor = ACTOR
    pool = _demo_pool(
        POOL, LAB_KNOBS, "demo: published ports on the loopback only, /outputs of 256 MiB"
    )
    dev = _demo_pool(DEV_POOL, DEV_KNOBS, "demo: allow the local process runtime")
    pools = [pool, dev]
    tenants = {}
    for slug, name in TENANTS:
        tenants[slug] = Tenant.objects.filter(slug=slug).first() or build_tenant(slug, name=name)
        # No service for quotas, priority classes and shapes: policy admins edit them.
        for each in pools:
            Quota.objects.get_or_create(
                tenant=tenants[slug],
                pool=each,
                defaults={"cpu_millicores": 64000, "memory_mib": 262144, "gpus": 4},
            )
    ensure_priority_classes()
    for shape in SHAPES:
        defaults = {k: v for k, v in shape.items() if k != "name"}
        ResourceShape.objects.update_or_create(pool=pool, name=shape["name"], defaults=defaults)
    # The dev pool's nodes offer the process runtime only (their agent found no Docker engine).
    ResourceShape.objects.update_or_create(
        pool=pools[1],
        name="cpu-small",
        defaults={k: v for k, v in SHAPES[0].items() if k != "name"} | DEV_SHAPE_FIELDS,
    )
    printout = []
    for username, password, memberships, platform_roles in PEOPLE:
        for tenant_slug, role in memberships.items():
            build_person(username, password=password, tenant=tenants[tenant_slug], role=role)
        for role in platform_roles:
            build_person(username, password=password, platform_role=role)
        roles = [f"{role} of {t}" for t, role in memberships.items()] + list(platform_roles)
        printout.append((username, password, ", ".join(roles)))
    for spec in NODES:
        if not Node.objects.filter(pool=pool, name=spec["name"]).exists():
            build_node(
                pool,
                actor=actor,
                message="example node (no agent)",
                runtimes=["docker"],
                ready=False,
                **PLACE,
                **spec,
            )
    _retire_phantoms(pool)
    return printout


def _retire_phantoms(pool) -> None:
    """A demo database from before the agent existed has its example nodes ready: retire them
    (they never had an agent, so they would take leases nobody runs)."""
    names = [spec["name"] for spec in NODES]
    for node in Node.objects.filter(pool=pool, name__in=names).exclude(
        state__in=(NodeState.REGISTERED, NodeState.RETIRED)
    ):
        node_services.node_retire(node=node, actor=ACTOR, message="example node without agent")


def agent_enrollment_token(pool_slug: str) -> str:
    """A fresh single-use enrollment token of the pool, for `make run`'s local agent."""
    pool = ComputePool.objects.get(slug=pool_slug)
    _, secret = node_services.enrollment_token_issue(
        pool=pool, actor=ACTOR, ttl=timedelta(hours=1), name="make run: local agent"
    )
    return secret
