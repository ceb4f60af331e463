"""Validation probes of a marketplace node's claims, and recovery probes of a device answered
by the agent's own code (nodes/services/probes.py, worker_agent/probe.py)."""

import re
from pathlib import Path

import pytest

from config import builders
from nodes import services
from nodes.api.serializers import ProbeResultSerializer
from nodes.challenge import challenge_differences
from nodes.choices import GpuHealth, NodeState, ProbeState
from nodes.errors import NodeScopeRefused
from pools.actors import Actor
from pools.reasons import Reason
from pools.statemachine import TransitionRefused
from tests.clients import bearer_client
from worker_agent.inventory import RecordedNvml, inventory_document, read_gpus
from worker_agent.probe import recovery_result

from .conftest import gpu_kernel_answer, last_event, measured, reasons

S = NodeState


def test_marketplace_node_needs_a_probe_and_passes(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    assert enrolled.probe.state == ProbeState.REQUESTED
    assert reasons(node) == [Reason.ENROLLED, Reason.PROBE_REQUESTED]
    # an authenticated heartbeat alone is not enough in a marketplace
    node = services.node_heartbeat(node=node, actor=Actor.for_node(node))
    assert node.state == S.REGISTERED
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(node)
    )
    assert probe.state == ProbeState.PASSED and probe.differences == []
    node.refresh_from_db()
    assert node.state == S.READY
    assert reasons(node)[-2:] == [Reason.PROBE_PASSED, Reason.PROBE_PASSED]


def test_probe_mismatch_quarantines_with_the_difference(enroll, market_pool):
    enrolled = enroll(market_pool)
    node = enrolled.node
    result = measured(node)
    result["gpus"][1]["model"] = "NVIDIA GeForce RTX 4090"
    result["cpu_count"] = 16
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert probe.state == ProbeState.FAILED
    node.refresh_from_db()
    assert node.state == S.QUARANTINED
    event = last_event(node)
    assert event.reason == Reason.PROBE_MISMATCH
    assert "RTX 4090" in event.message and "cpu: claimed 64000m, measured 16000m" in event.message
    assert event.data["differences"] == probe.differences


def test_probe_missing_benchmark_or_gpu_is_a_mismatch(enroll, market_pool):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node, benchmark={})
    result["gpus"].pop()
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert any("not seen" in d for d in probe.differences)
    assert "benchmark: no result" in probe.differences


def test_probe_result_only_from_that_nodes_credential_and_only_once(enroll, market_pool):
    first, second = enroll(market_pool), enroll(market_pool)
    with pytest.raises(NodeScopeRefused):
        services.probe_result_submit(
            probe=first.probe, credential=second.credential, result=measured(first.node)
        )
    first.probe.refresh_from_db()
    assert first.probe.state == ProbeState.REQUESTED
    services.probe_result_submit(
        probe=first.probe, credential=first.credential, result=measured(first.node)
    )
    with pytest.raises(TransitionRefused) as refused:
        services.probe_result_submit(
            probe=first.probe, credential=first.credential, result=measured(first.node)
        )
    assert refused.value.code == "probe_closed"


# --------------------------------------------------------------------------- the challenge


def test_each_validation_probe_carries_a_fresh_challenge_for_the_claims(enroll, market_pool):
    first, second = enroll(market_pool), enroll(market_pool)
    challenge = first.probe.challenge
    assert re.fullmatch(r"[0-9a-f]{32}", challenge["seed"])
    assert challenge["seed"] != second.probe.challenge["seed"]
    assert challenge["iterations"] == 300
    assert challenge["workers"] == 16  # 64 CPUs claimed, at most 16 chains
    assert challenge["memory_mib"] == 2048  # 512000 MiB claimed, proven up to 2048
    assert challenge["gpus"] == [g["uuid"] for g in first.node.inventory["gpus"]]
    assert challenge["image"] == builders.TEST_IMAGE  # pinned by digest
    assert challenge["seconds_max"] == 75.0


def test_the_agent_sees_the_challenge_in_its_heartbeat_answer(enroll, market_pool):
    enrolled = enroll(market_pool)
    answer = bearer_client(enrolled.secret).post("/api/v1/agent/heartbeat", {}, format="json")
    [probe] = answer.json()["probes"]
    assert probe["id"] == enrolled.probe.pk and probe["kind"] == "validation"
    assert probe["challenge"]["seed"] == enrolled.probe.challenge["seed"]


def test_the_right_answer_over_the_api_passes_and_the_node_is_ready(enroll, market_pool):
    enrolled = enroll(market_pool)
    url = f"/api/v1/agent/probes/{enrolled.probe.pk}/result"
    body = {"result": measured(enrolled.node)}
    response = bearer_client(enrolled.secret).post(url, body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "passed" and response.json()["differences"] == []
    enrolled.node.refresh_from_db()
    assert enrolled.node.state == S.READY


@pytest.mark.parametrize(
    ("answer", "difference"),
    [
        ({"answers": ["0" * 64] * 16}, "challenge: wrong answer (16 of 16 chains"),
        ({"seconds": 900.0}, "timing: 900.0s for 16 parallel chains"),
        ({"memory_mib": 100}, "memory: 2048 MiB asked of the claimed memory, 100 MiB filled"),
        ({"gpus": []}, "claimed, not visible in the probe container"),
        ({"error": "image_invalid: no such image"}, "challenge: the probe did not run"),
    ],
)
def test_a_wrong_answer_quarantines_naming_the_difference(enroll, market_pool, answer, difference):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node)
    result["challenge"] |= answer
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=result
    )
    assert probe.state == ProbeState.FAILED
    assert any(difference in d for d in probe.differences), probe.differences
    enrolled.node.refresh_from_db()
    assert enrolled.node.state == S.QUARANTINED
    event = last_event(enrolled.node)
    assert event.reason == Reason.PROBE_MISMATCH and difference in event.message


def test_one_wrong_chain_and_a_missing_answer_are_differences(enroll, market_pool):
    enrolled = enroll(market_pool)
    result = measured(enrolled.node)
    result["challenge"]["answers"][3] = "f" * 64
    assert challenge_differences(enrolled.probe.challenge, result["challenge"]) == [
        "challenge: wrong answer (1 of 16 chains of 300 sha256 rounds differ)"
    ]
    assert challenge_differences(enrolled.probe.challenge, None) == ["challenge: no answer"]


def test_a_gpu_less_node_answers_an_empty_list(enroll, market_pool):
    enrolled = enroll(market_pool, gpus=0)
    assert enrolled.probe.challenge["gpus"] == []
    probe = services.probe_result_submit(
        probe=enrolled.probe, credential=enrolled.credential, result=measured(enrolled.node)
    )
    assert probe.state == ProbeState.PASSED, probe.differences


@pytest.mark.parametrize(
    "answer",
    [
        {"answers": ["not hex"]},
        {"answers": ["a" * 64] * 65},
        {"seconds": -1},
        {"seconds": "fast"},
        {"gpus": ["x" * 81]},
        {"error": "e" * 501},
    ],
)
def test_a_malformed_answer_is_a_400_and_keeps_the_probe_open(enroll, market_pool, answer):
    enrolled = enroll(market_pool)
    url = f"/api/v1/agent/probes/{enrolled.probe.pk}/result"
    body = {"result": measured(enrolled.node, challenge=answer)}
    response = bearer_client(enrolled.secret).post(url, body, format="json")
    assert response.status_code == 400, response.content
    assert "challenge" in response.json()["result"]
    enrolled.probe.refresh_from_db()
    assert enrolled.probe.state == ProbeState.REQUESTED


# --------------------------------------------------------------------------- recovery probes
# The agent's answer (worker_agent.probe.recovery_result) built from the recorded NVML fixture
# and posted through the API: the control plane may import the agent, never the reverse.

NVML_FIXTURE = Path(__file__).parents[1] / "worker_agent" / "fixtures" / "nvml_h100_sxm_x4.json"


def recorded_nvml(**device_changes) -> RecordedNvml:
    nvml = RecordedNvml.from_file(NVML_FIXTURE)
    nvml.devices[0] |= device_changes
    return nvml


@pytest.fixture
def recorded_node(private_pool, operator):
    """A ready node whose agent reported the recorded 4×H100 inventory (the same UUIDs)."""
    inventory = inventory_document(
        read_gpus(recorded_nvml()), cpu_millicores=64000, memory_mib=512000
    )
    enrolled = builders.enroll_node(
        private_pool, "h100", actor=Actor.for_user(operator), inventory=inventory
    )
    client = bearer_client(enrolled.secret)
    assert client.post("/api/v1/agent/heartbeat", {}, format="json").status_code == 200
    enrolled.node.refresh_from_db()
    assert enrolled.node.state == S.READY
    return enrolled, client


def unsuitable_and_probed(node, client, gpu) -> dict:
    """The device runs too hot in a heartbeat: out of scheduling, a recovery probe listed."""
    hot = {"gpus": [{"uuid": gpu.uuid, "temperature_c": 95}]}
    answer = client.post("/api/v1/agent/heartbeat", hot, format="json")
    assert answer.status_code == 200, answer.content
    gpu.refresh_from_db()
    assert not gpu.healthy
    [probe] = [p for p in answer.json()["probes"] if p["kind"] == "recovery"]
    assert probe["gpu"] == gpu.uuid
    return probe


@pytest.mark.parametrize(
    "nvml",
    [recorded_nvml(), recorded_nvml(uuid="GPU-gone"), None],
    ids=["present", "missing", "no-driver"],
)
def test_the_agents_recovery_answer_is_what_the_serializer_accepts(nvml, tmp_path):
    uuid = RecordedNvml.from_file(NVML_FIXTURE).devices[0]["uuid"]
    probe = {"id": 5, "kind": "recovery", "gpu": uuid, "expected": {"uuid": uuid}}
    result = recovery_result(probe, nvml=nvml, workdir=tmp_path)
    serializer = ProbeResultSerializer(data={"result": result})
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["result"] == result  # nothing dropped or changed


def test_a_recovered_device_returns_to_scheduling(recorded_node, tmp_path):
    enrolled, client = recorded_node
    node = enrolled.node
    gpu = node.gpus.get(index=0)
    probe = unsuitable_and_probed(node, client, gpu)
    # the device cooled down: the agent measures it again, runs the GPU challenge's kernel on
    # it (here the reference functions stand in for a device) and answers
    assert probe["challenge"]["gpu_kernel"]["gpus"][0]["uuid"] == gpu.uuid
    result = recovery_result(
        probe, nvml=recorded_nvml(), workdir=tmp_path, run_in_process=gpu_kernel_answer
    )
    response = client.post(
        f"/api/v1/agent/probes/{probe['id']}/result", {"result": result}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == ProbeState.PASSED
    gpu.refresh_from_db()
    assert (gpu.healthy, gpu.health, gpu.health_flags) == (True, GpuHealth.OK, [])
    event = last_event(node)
    assert event.reason == Reason.GPU_RECOVERED and event.data["gpu"] == gpu.uuid
    listed = client.post("/api/v1/agent/heartbeat", {}, format="json").json()["probes"]
    assert listed == []  # answered: no longer asked


@pytest.mark.parametrize(
    ("nvml", "why"),
    [
        (recorded_nvml(temperature_c=95), "95°C ≥ 87°C"),
        (recorded_nvml(uuid="GPU-gone"), "not visible: NVML lists no device with this UUID"),
        (None, "not visible: NVML unavailable"),
    ],
    ids=["still-hot", "missing", "no-driver"],
)
def test_a_device_still_bad_stays_out_naming_why(recorded_node, tmp_path, nvml, why):
    enrolled, client = recorded_node
    node = enrolled.node
    gpu = node.gpus.get(index=0)
    probe = unsuitable_and_probed(node, client, gpu)
    result = recovery_result(probe, nvml=nvml, workdir=tmp_path)
    response = client.post(
        f"/api/v1/agent/probes/{probe['id']}/result", {"result": result}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == ProbeState.FAILED
    assert why in response.json()["differences"][0]
    gpu.refresh_from_db()
    assert not gpu.healthy
    event = last_event(node)
    assert event.reason == Reason.PROBE_FAILED and why in event.message
