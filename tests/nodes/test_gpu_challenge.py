"""The GPU challenge, verified on the CPU (no GPU here): honest answers computed with the agent's
own reference functions (worker_agent/gpu_kernel.py) pass; each kind of lie gets its reason and
quarantines; a hostile answer is a 400 and writes nothing (docs/nodes.md "GPU challenge")."""

import copy

import pytest

from nodes import services
from nodes.challenge import gpu_challenge_differences, gpu_gflops
from nodes.choices import NodeState, ProbeState
from nodes.models import NodeEvent
from pools.actors import Actor
from pools.reasons import Reason
from tests.clients import bearer_client
from worker_agent.gpu_kernel import FMA_PER_ITERATION, FMA_THREADS, pattern_word

from .conftest import gpu_kernel_answer, last_event, measured

S = NodeState
H100 = "NVIDIA H100 80GB HBM3"


def kernel_of(probe) -> list[dict]:
    return probe.challenge["gpu_kernel"]["gpus"]


def submit(enrolled, result):
    return services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )


def test_each_claimed_gpu_gets_its_own_nonce_fill_samples_and_kernel(enroll, market_pool):
    enrolled = enroll(market_pool)
    claims = enrolled.node.inventory["gpus"]
    gpus = kernel_of(enrolled.probe)
    assert [g["uuid"] for g in gpus] == [g["uuid"] for g in claims]
    assert len({g["nonce"] for g in gpus}) == 2  # fresh per GPU
    first = gpus[0]
    assert first["model"] == H100
    assert first["fill_bytes"] == (81559 - 2048) << 20  # the claim less the driver's reserve
    words = first["fill_bytes"] // 8
    assert first["samples"][0] == 0 and first["samples"][-1] == words - 1  # both ends
    assert 2 < len(first["samples"]) <= 64 and all(0 <= i < words for i in first["samples"])
    assert first["gflops_min"] == 33000 * 0.9  # the class × (1 − tolerance), pool knobs
    # the kernel runs about half a second at the class's floor
    flops = 2 * first["fma_blocks"] * FMA_THREADS * first["fma_iterations"] * FMA_PER_ITERATION
    assert 0.45 < flops / 33000e9 < 0.55
    assert "image" in enrolled.probe.challenge["gpu_kernel"]


def test_the_reference_pattern_is_splitmix64():
    assert pattern_word(0, 0) == 0xE220A8397B1DCDAF  # splitmix64's first output for seed 0
    assert pattern_word(0, 1) == 0x6E789E6AA1B965F4


def test_an_honest_answer_passes_and_readies_the_node(enroll, market_pool):
    enrolled = enroll(market_pool)
    url = f"/api/v1/agent/probes/{enrolled.probe.pk}/result"
    response = bearer_client(enrolled.secret).post(
        url, {"result": measured(enrolled.node)}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "passed", response.json()["differences"]
    enrolled.node.refresh_from_db()
    assert enrolled.node.state == S.READY


def lie_wrong_sample(answer, gpus):
    word = answer["gpus"][1]["samples"][5]
    answer["gpus"][1]["samples"][5] = f"{int(word, 16) ^ 1:016x}"


def lie_missing_samples(answer, gpus):
    answer["gpus"][0]["samples"] = answer["gpus"][0]["samples"][:10]


def lie_fma_check(answer, gpus):
    answer["gpus"][0]["fma_check"] = 0.0


def lie_model(answer, gpus):
    answer["gpus"][0]["model"] = "Tesla T4"


def lie_slow(answer, gpus):
    answer["gpus"][0]["fma_seconds"] *= 3  # 1.5 × the class → half of it


def lie_no_gpu(answer, gpus):
    answer["gpus"].pop()


def lie_gpu_error(answer, gpus):
    answer["gpus"][1] = {"uuid": gpus[1]["uuid"], "error": "cuMemAlloc_v2 failed: out of memory"}


def lie_no_driver(answer, gpus):
    answer.clear()
    answer["error"] = "no CUDA driver: libcuda.so.1: cannot open shared object file"


def lie_other_uuid(answer, gpus):
    answer["gpus"][0]["uuid"] = "GPU-ffffffff-aaaa-bbbb-cccc-dddddddddddd"


@pytest.mark.parametrize(
    ("lie", "reason", "words"),
    [
        (lie_wrong_sample, Reason.GPU_CHALLENGE_WRONG, "1 of "),
        (lie_missing_samples, Reason.GPU_CHALLENGE_WRONG, "sampled words differ"),
        (lie_fma_check, Reason.GPU_CHALLENGE_WRONG, "check value"),
        (lie_model, Reason.GPU_CHALLENGE_WRONG, "the device is Tesla T4"),
        (lie_slow, Reason.GPU_CHALLENGE_SLOW, "asks at least 29700"),
        (lie_no_gpu, Reason.GPU_CHALLENGE_MISSING, "no challenge answer"),
        (lie_gpu_error, Reason.GPU_CHALLENGE_MISSING, "out of memory"),
        (lie_no_driver, Reason.GPU_CHALLENGE_MISSING, "no CUDA driver"),
        (lie_other_uuid, Reason.GPU_CHALLENGE_WRONG, "a device not asked"),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v)[:20],
)
def test_a_lying_or_failing_gpu_quarantines_with_its_reason(
    enroll, market_pool, lie, reason, words
):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node)
    lie(result["gpu_kernel"], kernel_of(enrolled.probe))
    probe = submit(enrolled, result)
    assert probe.state == ProbeState.FAILED
    assert any(words in d for d in probe.differences), probe.differences
    enrolled.node.refresh_from_db()
    assert enrolled.node.state == S.QUARANTINED
    event = last_event(enrolled.node)
    assert event.reason == reason and words in event.message
    assert {c["reason"] for c in event.data["gpu_challenge"]} >= {reason.value}


def test_a_wrong_answer_outranks_a_slow_one():
    gpus = [
        {
            "uuid": "GPU-1",
            "model": H100,
            "nonce": "00000000000000aa",
            "fill_bytes": 1 << 20,
            "samples": [0, 7],
            "fma_b": 10,
            "fma_blocks": 1,
            "fma_iterations": 1,
            "gflops_min": 1.0,
        }
    ]
    answer = gpu_kernel_answer(gpus, gflops_factor=0.5)
    answer["gpus"][0]["samples"][1] = "0" * 16
    codes = [code for code, _ in gpu_challenge_differences(gpus, answer)]
    assert codes == [Reason.GPU_CHALLENGE_WRONG, Reason.GPU_CHALLENGE_SLOW]
    # the verdict's throughput is the control plane's, from the kernel's size and the duration
    assert gpu_gflops(gpus[0], 1.0) == 2 * FMA_THREADS * (FMA_PER_ITERATION + 8) / 1e9


def test_a_model_without_a_class_is_measured_not_judged(enroll, market_pool):
    enrolled = enroll(market_pool)
    gpus = copy.deepcopy(kernel_of(enrolled.probe))
    for gpu in gpus:
        gpu["gflops_min"] = None
    answer = gpu_kernel_answer(gpus, gflops_factor=0.01)
    assert gpu_challenge_differences(gpus, answer) == []


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a["gpus"][0].update(samples=["a" * 16] * 1025),
        lambda a: a["gpus"][0].update(samples=[12345]),
        lambda a: a["gpus"][0].update(samples="0123456789abcdef"),
        lambda a: a["gpus"][0].update(fma_seconds="fast"),
        lambda a: a["gpus"][0].update(fma_check=float("1e300")),
        lambda a: a["gpus"][0].update(uuid="G" * 81),
        lambda a: a["gpus"][0].update(error="e" * 501),
        lambda a: a.update(gpus=[a["gpus"][0]] * 65),
        lambda a: a.update(gpus={"uuid": "GPU-1"}),
    ],
    ids=[
        "too-many-samples",
        "sample-not-hex",
        "samples-a-string",
        "seconds-a-string",
        "check-huge",
        "uuid-long",
        "error-long",
        "too-many-gpus",
        "gpus-a-map",
    ],
)
def test_a_hostile_answer_is_a_400_and_writes_nothing(enroll, market_pool, change):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node)
    change(result["gpu_kernel"])
    events = NodeEvent.objects.filter(node=enrolled.node).count()
    url = f"/api/v1/agent/probes/{enrolled.probe.pk}/result"
    response = bearer_client(enrolled.secret).post(url, {"result": result}, format="json")
    assert response.status_code == 400, response.content
    assert "gpu_kernel" in response.json()["result"]
    enrolled.probe.refresh_from_db()
    assert enrolled.probe.state == ProbeState.REQUESTED
    assert NodeEvent.objects.filter(node=enrolled.node).count() == events


def test_a_recovery_probe_runs_the_same_kernel_and_a_slow_device_stays_out(ready_node):
    node = ready_node.node
    gpu = node.gpus.get(index=0)
    services.node_heartbeat(
        node=node, actor=Actor.for_node(node), gpus=[{"uuid": gpu.uuid, "temperature_c": 95}]
    )
    probe = node.probes.get(kind="recovery")
    [challenged] = kernel_of(probe)
    assert challenged["uuid"] == gpu.uuid and challenged["nonce"]
    answer = gpu_kernel_answer([challenged], gflops_factor=0.5)
    readings = {"passed": True, "temperature_c": 50, "health_check": "passed"}
    failed = services.probe_result_submit(
        probe=probe, credential=ready_node.credential, result=readings | {"gpu_kernel": answer}
    )
    assert failed.state == ProbeState.FAILED
    event = last_event(node)
    assert event.reason == Reason.GPU_CHALLENGE_SLOW and "GFLOP/s" in event.message
    gpu.refresh_from_db()
    assert not gpu.healthy
