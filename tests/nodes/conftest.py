"""Fixtures of the node tests (built by config.builders): an operator and a tenant of their
own, and a ready node enrolled through the token path like an agent's."""

import hashlib
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from config.builders import SYSTEM, build_person, build_tenant, submit_job
from jobs.choices import JobState
from jobs.services import job_transition
from leases.choices import LeaseState
from leases.models import Lease
from leases.services import lease_transition
from nodes.models import NodeEvent
from pools.actors import Actor
from pools.choices import PlatformRole, TokenScope
from pools.reasons import Reason
from tests.clients import client_for
from worker_agent.gpu_kernel import expected_samples, fma_check_expected, fma_flops


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def operator(db):
    return build_person("olga", platform_role=PlatformRole.OPERATOR)


@pytest.fixture
def person(db):
    return build_person("pete")


@pytest.fixture
def tenant(db):
    return build_tenant("lab", name="Lab")


@pytest.fixture
def ready_node(agent):
    """The node tests' ready node is an agent's (tests/conftest.py)."""
    return agent


@pytest.fixture
def make_job(tenant, person):
    def make(node, *, state=JobState.RUNNING, checkpointable=False, cpu=1000, memory=1024):
        """A job with a lease on `node`, whatever the node's state (the scheduler would place
        only on a ready one, so no service does this): the ledger is charged like a
        reservation's guarded write would."""
        job = submit_job(
            node.pool,
            tenant,
            cpu=cpu,
            memory=memory,
            actor=Actor.for_user(person),
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
    return client_for(operator, (TokenScope.READ, TokenScope.WRITE, TokenScope.OPERATE))


@pytest.fixture
def person_api(person):
    client = APIClient()
    client.force_login(person)
    return client


def reasons(node) -> list[str]:
    return list(NodeEvent.objects.filter(node=node).values_list("reason", flat=True))


def last_event(node):
    return NodeEvent.objects.filter(node=node).last()


def challenge_answer(probe, **overrides) -> dict:
    """What an honest node's probe container answers to the probe's challenge: each chain
    recomputed here with hashlib (as busybox's `printf %s "$x" | sha256sum` does)."""
    challenge = probe.challenge
    answers = []
    for i in range(challenge["workers"]):
        value = f"{challenge['seed']}-{i}"
        for _ in range(challenge["iterations"]):
            value = hashlib.sha256(value.encode()).hexdigest()
        answers.append(value)
    answer = {"answers": answers, "seconds": 2.5, "memory_mib": challenge["memory_mib"]}
    return answer | {"gpus": list(challenge["gpus"])} | overrides


def measured(node, **overrides) -> dict:
    """A validation probe's result that matches the node's claims (and answers its newest
    validation probe's challenge), but for `overrides`."""
    claims = node.inventory
    result = {
        "cpu_count": claims["cpu_millicores"] // 1000,
        "memory_mib": claims["memory_mib"] - 2000,  # a container sees a little less
        "gpus": [
            {"uuid": g["uuid"], "model": g["model"], "memory_mib": g["memory_mib"]}
            for g in claims["gpus"]
        ],
        "benchmark": {"matmul_tflops": 612.0},
    }
    probe = node.probes.filter(kind="validation").order_by("-id").first()
    if probe is not None and probe.challenge:
        result["challenge"] = challenge_answer(probe)
        if probe.challenge.get("gpu_kernel"):
            result["gpu_kernel"] = gpu_kernel_answer(probe.challenge["gpu_kernel"]["gpus"])
    return result | overrides


def gpu_kernel_answer(gpus: list[dict], *, gflops_factor: float = 1.5) -> dict:
    """What an honest agent's GPU kernel answers (worker_agent/gpu_kernel.py): the sampled
    words and the FMA check from the reference functions, the FMA kernel timed at
    `gflops_factor` × its class (or, unclassed, a plausible duration)."""
    answers = []
    for gpu in gpus:
        gflops = (gpu.get("gflops_min") or 100_000) * gflops_factor
        answers.append(
            {
                "uuid": gpu["uuid"],
                "model": gpu.get("model", ""),
                "memory_mib": (gpu["fill_bytes"] >> 20) + 2048,
                "cuda_name": gpu.get("model", ""),
                "cuda_memory_mib": (gpu["fill_bytes"] >> 20) + 2048,
                "samples": expected_samples(gpu["nonce"], gpu["samples"]),
                "fill_seconds": 0.04,
                "fma_seconds": round(fma_flops(gpu) / (gflops * 1e9), 6),
                "gflops": round(gflops, 1),
                "fma_check": fma_check_expected(gpu["fma_b"]),
            }
        )
    return {"gpus": answers, "seconds": 2.0}
