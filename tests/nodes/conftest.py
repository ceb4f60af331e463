"""Factories for node tests: state is built through services, never by setting fields."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.choices import JobState
from jobs.services import job_submit, job_transition
from leases.choices import LeaseState
from leases.models import Lease
from leases.services import lease_transition
from nodes import services
from pools import services as pool_services
from pools.actors import Actor
from pools.choices import PlatformRole, TokenScope, TrustLevel
from pools.reasons import Reason

SYSTEM = Actor.system("tests")


def gpu(i: int, **extra) -> dict:
    return {
        "index": i,
        "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
        "model": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "mig_enabled": False,
        "interconnect_group": "nvl0",
        "numa_node": i // 4,
        **extra,
    }


def inventory(*, gpus: int = 2, cpu: int = 64000, memory: int = 512000, uuid_tag: str = ""):
    devices = [gpu(i) for i in range(gpus)]
    if uuid_tag:
        for d in devices:
            d["uuid"] = d["uuid"].replace("dddd", uuid_tag[:4].ljust(4, "0"), 1)
    return {
        "cpu_millicores": cpu,
        "memory_mib": memory,
        "scratch_mib": 1_000_000,
        "numa": [{"id": 0, "cpus": 32, "memory_mib": memory // 2}, {"id": 1, "cpus": 32}],
        "gpus": devices,
    }


class Enrolled:
    """A node enrolled through the token path, with its credential secret."""

    def __init__(self, node, secret, probe):
        self.node, self.secret, self.probe = node, secret, probe

    @property
    def credential(self):
        return self.node.credentials.order_by("-created_at", "-id").first()


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def operator(db):
    user = User.objects.create_user("olga", password="pw")
    pool_services.platform_role_grant(user=user, role=PlatformRole.OPERATOR)
    return user


@pytest.fixture
def person(db):
    return User.objects.create_user("pete", password="pw")


@pytest.fixture
def tenant(db):
    return pool_services.tenant_create(name="Lab", slug="lab")


@pytest.fixture
def private_pool(db):
    return pool_services.pool_create(name="Private", slug="private")


@pytest.fixture
def market_pool(db):
    return pool_services.pool_create(
        name="Market", slug="market", trust_level=TrustLevel.MARKETPLACE
    )


@pytest.fixture
def enroll(db, operator):
    counter = {"n": 0}

    def make(pool, *, name=None, gpus=2, now=None, **fields):
        counter["n"] += 1
        n = counter["n"]
        _, secret = services.enrollment_token_issue(pool=pool, actor=Actor.for_user(operator))
        node, credential, probe = services.node_enroll(
            secret=secret,
            name=name or f"node-{n}",
            inventory=inventory(gpus=gpus, uuid_tag=f"{n:04d}"),
            identity=f"ssh-ed25519 AAAA{n}",
            now=now,
            **fields,
        )
        return Enrolled(node, credential, probe)

    return make


@pytest.fixture
def ready_node(enroll, private_pool):
    """A private-fleet node made ready by its first authenticated heartbeat."""
    enrolled = enroll(private_pool)
    enrolled.node = services.node_heartbeat(node=enrolled.node, actor=Actor.for_node(enrolled.node))
    return enrolled


@pytest.fixture
def make_job(tenant, person):
    def make(node, *, state=JobState.RUNNING, checkpointable=False, cpu=1000, memory=1024):
        """A job with a lease on `node`; the ledger is charged like a reservation would."""
        job = job_submit(
            tenant=tenant,
            pool=node.pool,
            name="train",
            image="127.0.0.1:5000/computepool/busybox@sha256:" + "0" * 64,
            actor=Actor.for_user(person),
            resources={"cpu_millicores_min": cpu, "memory_mib_min": memory},
            checkpointable=checkpointable,
        )
        type(node).objects.filter(pk=node.pk).update(
            cpu_millicores_reserved=F("cpu_millicores_reserved") + cpu,
            memory_mib_reserved=F("memory_mib_reserved") + memory,
        )
        lease = Lease.objects.create(
            pool=node.pool,
            tenant=tenant,
            node=node,
            job=job,
            cpu_millicores=cpu,
            memory_mib=memory,
            expires_at=timezone.now() + timedelta(hours=1),
        )
        path = [JobState.LEASED, JobState.STARTING, JobState.RUNNING]
        for step in path[: path.index(state) + 1]:
            job = job_transition(job=job, to=step, actor=SYSTEM, reason=Reason.PLACED)
        if state in (JobState.STARTING, JobState.RUNNING):
            lease = lease_transition(
                lease=lease, to=LeaseState.COMMITTED, actor=SYSTEM, reason=Reason.COMMITTED
            )
        return job, lease

    return make


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def operator_api(operator):
    client = APIClient()
    _, secret = pool_services.api_token_issue(
        user=operator,
        name="ops",
        scopes=[TokenScope.READ, TokenScope.WRITE, TokenScope.OPERATE],
    )
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def person_api(person):
    client = APIClient()
    client.force_login(person)
    return client


def node_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client
