"""Builders of state, through the services: the one way tests, the demo and the lease benchmark
make pools, tenants, people, nodes and jobs.

They sit in the top layer because they use every app's services. Keyword arguments with
defaults that make a working set-up; everything is written the way the product writes it (events,
policy versions, ledger columns), never by setting fields behind the services' backs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.contrib.auth import get_user_model

from jobs.services import job_submit, jobs_submit_many
from nodes import services as node_services
from pools.actors import Actor
from pools.choices import TenantRole
from pools.models import AllowedRegistry, PoolTrustedKey, PriorityClass
from pools.registry import resolve
from pools.services import (
    api_token_issue,
    membership_set,
    platform_role_grant,
    policy_version_publish,
    pool_create,
    tenant_create,
    tenant_secret_set,
)
from worker_agent.identity import NodeKey

SYSTEM = Actor.system("builders")
LOCAL_REGISTRY = "127.0.0.1:5000/computepool/"
# The busybox test image that .ci/ensure-services.sh builds and pushes to the loopback registry.
TEST_IMAGE_TAG = LOCAL_REGISTRY + "busybox:test"
# The recorded 4×H100 node (tests/worker_agent/fixtures): what an agent reports for one device.
RECORDED_GPU = {
    "model": "NVIDIA H100 80GB HBM3",
    "memory_mib": 81559,
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "compute_capability": "9.0",
    "mig_enabled": False,
    "interconnect_group": "nvl0",
}


@functools.cache
def pinned_test_image() -> str:  # not test_…: pytest would collect it where imported
    """The test image pinned by its real digest (what a submit of TEST_IMAGE_TAG stores), asked
    of the registry once per process: jobs run and are checked by digest only."""
    return resolve("127.0.0.1:5000", "computepool/busybox", "test").pinned


def __getattr__(name):
    # `from config.builders import TEST_IMAGE` still works: resolved on first use, not at import.
    if name == "TEST_IMAGE":
        return pinned_test_image()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_pool(
    slug: str = "test",
    *,
    name: str = "",
    exact_capacity: bool = False,
    registry: str | None = LOCAL_REGISTRY,
    actor: Actor | None = None,
    **fields,
):
    """A pool with its first policy version. `exact_capacity`: allocatable == raw (no system
    reserve, no safety margin), so tests can fill a node to the last millicore. `registry`: the
    allowed image prefix (None: no registry row)."""
    if exact_capacity:
        fields = {
            "system_reserve_cpu_millicores": 0,
            "system_reserve_memory_mib": 0,
            "safety_margin_percent": 0,
            **fields,
        }
    pool = pool_create(name=name or f"Pool {slug}", slug=slug, actor=actor, **fields)
    if registry:
        # No service exists for registries: a policy admin edits them in the admin.
        AllowedRegistry.objects.create(pool=pool, prefix=registry)
    return pool


def set_pool_knobs(pool, **knobs):
    """A new policy version of the pool with these knobs changed (the others kept)."""
    current = pool.scheduling_policy.current
    return policy_version_publish(
        policy=pool.scheduling_policy,
        weights=dict(current.weights),
        knobs=dict(current.knobs or {}) | knobs,
        comment="builders: knobs",
        actor=SYSTEM,
    )


def build_trusted_key(pool, public_key_pem: str, *, name: str = "release"):
    """A public key whose image signatures the (sensitive) pool accepts; no service exists, a
    policy admin edits them in the admin."""
    return PoolTrustedKey.objects.create(pool=pool, name=name, public_key_pem=public_key_pem)


def build_tenant(slug: str, *, name: str = ""):
    return tenant_create(name=name or slug.title(), slug=slug)


def build_person(
    username: str,
    *,
    password: str = "",
    tenant=None,
    role: str = TenantRole.MEMBER,
    platform_role: str | None = None,
):
    """A person (created once; the demo loads twice), with a membership of `tenant` in `role`
    and/or a platform role. The password defaults to "pw-<username>"."""
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_password(password or f"pw-{username}")
        user.save(update_fields=["password"])
    if tenant is not None:
        membership_set(user=user, tenant=tenant, role=role, actor=SYSTEM)
    if platform_role:
        platform_role_grant(user=user, role=platform_role)
    return user


def build_secret(tenant, name: str = "api-token", value: str = "s3cr3t-value-42"):
    """A tenant secret (jobs refer to it by name in `secrets`)."""
    return tenant_secret_set(tenant=tenant, name=name, value=value)


def build_token(user, *, scopes=None, name: str = "test") -> str:
    """An API token's secret for `user` (a CLI's bearer credential); no scopes given: the
    service's default (pools.services.DEFAULT_TOKEN_SCOPES)."""
    return api_token_issue(user=user, name=name, scopes=None if scopes is None else list(scopes))[1]


# The keys builders bound to nodes, by node id: what a test's agent client signs with
# (tests/clients.py). A node's agent keeps its key in a file; a test keeps it here.
NODE_KEYS: dict[int, NodeKey] = {}


def build_node_key(node) -> NodeKey:
    """The key bound to `node`: a new one bound now when it has none (as its agent's
    enrollment would), the one bound earlier by this process otherwise."""
    if node.pk in NODE_KEYS and NODE_KEYS[node.pk].fingerprint == node.identity_fingerprint:
        return NODE_KEYS[node.pk]
    key = NodeKey.generate()
    node_services.node_key_bind(node=node, public_key=key.public_key, actor=SYSTEM)
    NODE_KEYS[node.pk] = key
    return key


def build_node_credential(node) -> str:
    """A credential secret bound to `node` (its agent's bearer credential); the node gets a
    key too (build_node_key), which its requests must be signed by."""
    build_node_key(node)
    return node_services.node_credential_issue(node=node)[1]


def gpu(index: int, **fields) -> dict:
    """One GPU device as an agent reports it and `node_register` takes it."""
    return {
        "index": index,
        "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        **RECORDED_GPU,
        "numa_node": index // 4,
        **fields,
    }


def gpu_inventory(*, gpus: int = 2, cpu: int = 64000, memory: int = 512000, uuid_tag: str = ""):
    """An agent's inventory report: CPU, memory, scratch, NUMA and `gpus` recorded H100s.
    `uuid_tag` makes the device UUIDs unique per node (UUIDs are unique fleet-wide)."""
    devices = [gpu(i) for i in range(gpus)]
    if uuid_tag:
        for device in devices:
            device["uuid"] = device["uuid"].replace("dddd", uuid_tag[:4].ljust(4, "0"), 1)
    return {
        "cpu_millicores": cpu,
        "memory_mib": memory,
        "scratch_mib": 1_000_000,
        "numa": [{"id": 0, "cpus": 32, "memory_mib": memory // 2}, {"id": 1, "cpus": 32}],
        "gpus": devices,
    }


def build_node(
    pool,
    name: str,
    *,
    cpu: int = 4000,
    memory: int = 8192,
    scratch: int = 100_000,  # disk: every job's /outputs filesystem is some (output_limit_mib)
    gpus=(),
    ready: bool = True,
    actor: Actor = SYSTEM,
    message: str = "",
    **fields,
):
    """A node registered by an operator (not enrolled by an agent), verified and made ready.
    `gpus`: one dict of `gpu()` fields per device, e.g. `[{}, {"sharing_mode": "timeslice"}]`."""
    devices = [gpu(i, uuid=f"GPU-{pool.slug}-{name}-{i}", **spec) for i, spec in enumerate(gpus)]
    node = node_services.node_register(
        pool=pool,
        name=name,
        actor=actor,
        cpu_millicores=cpu,
        memory_mib=memory,
        scratch_mib=scratch,
        gpus=devices,
        **fields,
    )
    if ready:
        node = node_services.node_verify(node=node, actor=actor, message=message)
        node = node_services.node_mark_ready(node=node, actor=actor, message=message)
    return node


@dataclass
class Enrolled:
    """A node enrolled through the token path, with its credential secret and open probe."""

    node: object
    secret: str
    probe: object = None

    @property
    def credential(self):
        return self.node.credentials.order_by("-created_at", "-id").first()


def enroll_node(pool, name: str, *, actor: Actor, inventory: dict, now=None, **fields) -> Enrolled:
    """What an agent does: an operator issues an enrollment token, the agent makes its key and
    enrolls with it (the key kept in NODE_KEYS for the test's signed client)."""
    _, token = node_services.enrollment_token_issue(pool=pool, actor=actor)
    key = NodeKey.generate()
    node, secret, probe = node_services.node_enroll(
        secret=token, name=name, inventory=inventory, public_key=key.public_key, now=now, **fields
    )
    NODE_KEYS[node.pk] = key
    return Enrolled(node, secret, probe)


def cpu_request(cpu: int = 1000, memory: int = 1024, scratch: int = 0, **extra) -> dict:
    """A request (the shape fields of POST /compute-leases and job submission) for CPU only."""
    return {
        "cpu_millicores_min": cpu,
        "memory_mib_min": memory,
        "scratch_mib": scratch,
        "gpu_sharing_class": "none",
        "gpu_count": 0,
        **extra,
    }


def gpu_request(
    sharing="exclusive", count=1, milli=0, mig_profile="", cpu=1000, memory=1024
) -> dict:
    return cpu_request(
        cpu,
        memory,
        gpu_sharing_class=sharing,
        gpu_count=count,
        gpu_milli=milli,
        mig_profile=mig_profile,
    )


def build_priority_class(name: str, value: int, **fields):
    """A priority class (`preemptible`, `may_preempt`, `max_wait_s` …); classes are catalogue
    rows that policy admins create in the admin, without a service."""
    return PriorityClass.objects.create(name=name, value=value, **fields)


def submit_job(
    pool,
    tenant,
    name: str = "train",
    *,
    cpu: int = 1000,
    memory: int = 512,
    priority=None,
    actor: Actor = SYSTEM,
    image: str = "",
    **fields,
):
    """A queued CPU job, through the service (the scheduling pass places it); `image` defaults
    to the real test image's digest (pinned_test_image())."""
    return job_submit(
        tenant=tenant,
        pool=pool,
        name=name,
        image=image or pinned_test_image(),
        actor=actor,
        resources=cpu_request(cpu=cpu, memory=memory),
        priority_class=priority,
        **fields,
    )


# --- in bulk, for benchmarks of thousands of nodes and jobs ----------------------------------


def build_fleet(pool, specs: list[dict], *, actor: Actor = SYSTEM, now=None) -> list:
    """Many ready nodes at once through `nodes_register_ready` (as `build_node` makes each one,
    in bulk: one at a time costs ~15 ms a node). Each spec: `name`, `cpu`, `memory`, `scratch`,
    `gpus` (`gpu()` fields per device, as `build_node`), and other Node fields (zone, labels …)."""
    fleet = []
    for spec in specs:
        spec = dict(spec)
        name, gpus = spec.pop("name"), spec.pop("gpus", ())
        fleet.append(
            {
                "name": name,
                "cpu_millicores": spec.pop("cpu"),
                "memory_mib": spec.pop("memory"),
                "scratch_mib": spec.pop("scratch", 0),
                "gpus": [
                    gpu(i, uuid=f"GPU-{pool.slug}-{name}-{i}", **g) for i, g in enumerate(gpus)
                ],
                **spec,
            }
        )
    return node_services.nodes_register_ready(pool=pool, specs=fleet, actor=actor, now=now)


def submit_jobs(pool, specs: list[dict], *, actor: Actor = SYSTEM, now=None) -> list:
    """Many queued jobs at once through `jobs_submit_many` (as `submit_job` queues each one, in
    bulk). Each spec: `tenant`, `name`, `resources` (a request dict), and other Job fields
    (priority_class, image — the pinned test image by default —, image_platforms …)."""
    specs = [spec if "image" in spec else {**spec, "image": pinned_test_image()} for spec in specs]
    return jobs_submit_many(pool=pool, specs=specs, actor=actor, now=now)
