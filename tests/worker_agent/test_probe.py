"""The validation probe run for real (worker_agent/probe.py): the challenge's seeded work, the
memory fill and the GPU list in a container of the busybox test image on the real Docker engine
(and in a subprocess under the process runtime), answered as the control plane recomputes it;
and the recovery probe of one device, measured again through the recorded NVML fixture."""

import hashlib
import time
from pathlib import Path

import pytest

from worker_agent.agent import Agent, Config
from worker_agent.inventory import RecordedNvml
from worker_agent.probe import probe_script, recovery_result, run_challenge
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessRuntime

from .conftest import IDS, make_owner

pytestmark = pytest.mark.docker
SEED = "0123456789abcdef0123456789abcdef"


def chains(seed: str, workers: int, iterations: int) -> list[str]:
    """What the control plane expects: chain i is sha256 iterated over "<seed>-<i>"."""
    answers = []
    for i in range(workers):
        value = f"{seed}-{i}"
        for _ in range(iterations):
            value = hashlib.sha256(value.encode()).hexdigest()
        answers.append(value)
    return answers


def challenge(image: str, **changes) -> dict:
    return {
        "seed": SEED,
        "iterations": 40,
        "workers": 2,
        "memory_mib": 16,
        "gpus": [],
        "image": image,
        "seconds_max": 60,
    } | changes


@pytest.fixture
def docker_runtime(docker_client):
    return DockerRuntime(make_owner("test-node"), client=docker_client)


def test_the_probe_container_answers_the_challenge(
    docker_runtime, docker_client, test_image, tmp_path
):
    probe = next(IDS)
    answer = run_challenge(
        probe, challenge(test_image), runtime=docker_runtime, workdir=tmp_path / "p"
    )
    assert answer["answers"] == chains(SEED, 2, 40), answer
    assert answer["memory_mib"] == 16  # filled the whole tmpfs of the claimed size
    assert answer["gpus"] == []  # no GPUs here, none claimed
    assert 0 < answer["seconds"] < 60
    assert docker_client.containers.list(all=True, filters={"name": f"job0-l{probe}"}) == []
    assert not (tmp_path / "p").exists()


def test_the_memory_asked_is_written_into_a_tmpfs_of_that_size(
    docker_runtime, test_image, tmp_path
):
    # the tmpfs is sized to the claim, the container's memory to the claim + a margin: RAM
    answer = run_challenge(
        next(IDS), challenge(test_image, memory_mib=48), runtime=docker_runtime, workdir=tmp_path
    )
    assert answer["memory_mib"] == 48


def test_claimed_gpus_missing_here_are_not_answered(docker_runtime, test_image, tmp_path):
    gpu = "GPU-5f0c2b1a-77e1-4c3e-9d0b-000000000000"
    answer = run_challenge(
        next(IDS), challenge(test_image, gpus=[gpu]), runtime=docker_runtime, workdir=tmp_path
    )
    assert "error" in answer and "answers" not in answer


@pytest.mark.parametrize(
    "changes",
    [
        {"seed": "$(touch /tmp/pwned)"},
        {"iterations": 0},
        {"workers": 65},
        {"memory_mib": -1},
        {"gpus": ["GPU-x; rm -rf /"]},
        {"iterations": "many"},
    ],
)
def test_a_challenge_out_of_range_is_refused_before_anything_runs(
    docker_runtime, tmp_path, changes
):
    answer = run_challenge(1, challenge("img", **changes), runtime=docker_runtime, workdir=tmp_path)
    assert set(answer) == {"error"}


def test_the_script_holds_only_the_challenges_numbers():
    script = probe_script(challenge("img", iterations=7, workers=3, memory_mib=5))
    assert "-lt 7 " in script and "-lt 3 " in script and "$((5 * 1048576))" in script
    assert f"chain {SEED} $w" in script


def test_the_process_runtime_answers_the_same(tmp_path):
    runtime = ProcessRuntime(make_owner(), tmp_path / "state.work")
    answer = run_challenge(next(IDS), challenge(""), runtime=runtime, workdir=tmp_path / "p")
    assert answer["answers"] == chains(SEED, 2, 40)
    assert answer["memory_mib"] == 16 and answer["gpus"] == []


def test_the_agent_runs_a_requested_probe_and_posts_its_result(
    tmp_path, control_plane, docker_runtime, test_image
):
    probe = next(IDS)
    requested = {"id": probe, "kind": "validation", "challenge": challenge(test_image)}
    control_plane.answers["agent/heartbeat"] = {"probes": [requested]}
    agent = Agent(
        Config(api=control_plane.url, state_dir=str(tmp_path / "state"), node_name="test-node"),
        runtimes={"docker": docker_runtime},
    )
    agent.state.save_credential({"credential": control_plane.credential})
    agent.heartbeat()
    agent.heartbeat()  # the probe is run once, however often it is listed
    deadline = time.monotonic() + 60
    while not control_plane.sent(f"agent/probes/{probe}/result") and time.monotonic() < deadline:
        time.sleep(0.2)
    [body] = control_plane.sent(f"agent/probes/{probe}/result")
    result = body["result"]
    assert result["challenge"]["answers"] == chains(SEED, 2, 40)
    assert result["challenge"]["memory_mib"] == 16
    assert result["cpu_millicores"] > 0 and result["memory_mib"] > 0
    assert result["benchmark"]["sha256_rounds_per_second"] > 0
    agent.host.close()


# --------------------------------------------------------------------------- recovery probes

FIXTURE = Path(__file__).parent / "fixtures" / "nvml_h100_sxm_x4.json"


def recorded_nvml(**device_changes) -> RecordedNvml:
    """The recorded 4×H100 node; `device_changes` alter its first device's readings."""
    nvml = RecordedNvml.from_file(FIXTURE)
    nvml.devices[0] |= device_changes
    return nvml


def recovery_probe(uuid: str, probe_id: int | None = None) -> dict:
    """A recovery probe as the heartbeat answer lists it (nodes/api/serializers.py)."""
    probe_id = probe_id or next(IDS)
    return {
        "id": probe_id,
        "kind": "recovery",
        "state": "requested",
        "gpu": uuid,
        "expected": {"uuid": uuid},
        "challenge": {},
    }


def test_a_present_device_is_measured_again_through_nvml(tmp_path):
    nvml = recorded_nvml()
    uuid = nvml.devices[0]["uuid"]
    result = recovery_result(recovery_probe(uuid), nvml=nvml, workdir=tmp_path)
    assert result["passed"] is True and "error" not in result
    assert result["gpus"] == [{"uuid": uuid, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}]
    assert (result["temperature_c"], result["slowdown_temperature_c"]) == (41, 87)
    assert (result["pcie_link_width"], result["pcie_link_width_max"]) == (16, 16)
    assert result["ecc_errors_uncorrected"] == 0 and result["nvlink_down"] == 0
    assert "health_check" not in result  # no engine given: no container was run


def test_a_device_still_bad_is_reported_as_measured(tmp_path):
    # the agent reports; the control plane judges (the device stays out, naming why)
    nvml = recorded_nvml(temperature_c=95, pcie_link_width=8, ecc_uncorrected_volatile=3)
    result = recovery_result(recovery_probe(nvml.devices[0]["uuid"]), nvml=nvml, workdir=tmp_path)
    assert (result["temperature_c"], result["pcie_link_width"]) == (95, 8)
    assert result["ecc_errors_uncorrected"] == 3


def test_a_missing_device_answers_not_visible(tmp_path):
    gone = "GPU-5f0c2b1a-77e1-4c3e-9d0b-0000000000ff"
    result = recovery_result(recovery_probe(gone), nvml=recorded_nvml(), workdir=tmp_path)
    assert result == {
        "passed": False,
        "error": f"device {gone} not visible: NVML lists no device with this UUID",
    }


def test_a_node_without_nvml_answers_not_visible(tmp_path):
    uuid = "GPU-5f0c2b1a-77e1-4c3e-9d0b-000000000000"
    result = recovery_result(recovery_probe(uuid), nvml=None, workdir=tmp_path)
    assert result["passed"] is False
    assert result["error"].startswith(f"device {uuid} not visible: NVML unavailable")


@pytest.mark.parametrize("uuid", ["", "GPU-x; rm -rf /", None, 7])
def test_a_probe_naming_no_device_is_answered_without_running_anything(tmp_path, uuid):
    probe = recovery_probe("x") | {"gpu": uuid, "expected": {"uuid": uuid}}
    assert recovery_result(probe, nvml=recorded_nvml(), workdir=tmp_path) == {
        "passed": False,
        "error": "the probe names no device",
    }


def test_an_engine_that_cannot_give_the_device_fails_the_container_check(
    docker_runtime, docker_client, tmp_path
):
    """NVML sees the device but the engine cannot hand it to a container (here: no NVIDIA
    runtime): jobs could not use it either, so the probe fails, saying so."""
    nvml = recorded_nvml()
    probe = recovery_probe(nvml.devices[0]["uuid"])
    result = recovery_result(probe, nvml=nvml, runtime=docker_runtime, workdir=tmp_path / "r")
    assert result["passed"] is False and result["health_check"] == "failed"
    assert result["error"].startswith("a container with the device did not run")
    assert result["temperature_c"] == 41  # the NVML readings travel with it
    leftover = docker_client.containers.list(all=True, filters={"name": f"job0-l{probe['id']}"})
    assert leftover == [] and not (tmp_path / "r").exists()


def test_the_agent_answers_a_listed_recovery_probe_once(tmp_path, control_plane):
    nvml = recorded_nvml()
    probe = recovery_probe(nvml.devices[1]["uuid"])
    control_plane.answers["agent/heartbeat"] = {"probes": [probe]}
    agent = Agent(
        Config(api=control_plane.url, state_dir=str(tmp_path / "state"), node_name="test-node"),
        runtimes={"process": ProcessRuntime(make_owner(), tmp_path / "state.work")},
    )
    agent.host.nvml = nvml  # the recorded driver in place of a real one
    agent.state.save_credential({"credential": control_plane.credential})
    agent.heartbeat()
    agent.heartbeat()  # listed again while it runs: answered once
    deadline = time.monotonic() + 20
    while not control_plane.sent(f"agent/probes/{probe['id']}/result"):
        assert time.monotonic() < deadline, "no recovery result was posted"
        time.sleep(0.05)
    time.sleep(0.2)
    [body] = control_plane.sent(f"agent/probes/{probe['id']}/result")
    assert body["result"]["passed"] is True
    assert body["result"]["gpus"][0]["uuid"] == probe["gpu"]
    assert "health_check" not in body["result"]  # the process runtime runs no device container
