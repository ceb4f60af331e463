"""The validation probe run for real (worker_agent/probe.py): the challenge's seeded work, the
memory fill and the GPU list in a container of the busybox test image on the real Docker engine
(and in a subprocess under the process runtime), answered as the control plane recomputes it."""

import hashlib
import itertools
import time

import pytest

from worker_agent.agent import Agent, Config
from worker_agent.probe import probe_script, run_challenge
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessRuntime

pytestmark = pytest.mark.docker
PROBES = itertools.count(int(time.time()) % 100000 * 100 + 90)
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
    return DockerRuntime("test-node", client=docker_client)


def test_the_probe_container_answers_the_challenge(
    docker_runtime, docker_client, test_image, tmp_path
):
    probe = next(PROBES)
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
        next(PROBES), challenge(test_image, memory_mib=48), runtime=docker_runtime, workdir=tmp_path
    )
    assert answer["memory_mib"] == 48


def test_claimed_gpus_missing_here_are_not_answered(docker_runtime, test_image, tmp_path):
    gpu = "GPU-5f0c2b1a-77e1-4c3e-9d0b-000000000000"
    answer = run_challenge(
        next(PROBES), challenge(test_image, gpus=[gpu]), runtime=docker_runtime, workdir=tmp_path
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
    runtime = ProcessRuntime("test-node", tmp_path / "state")
    answer = run_challenge(next(PROBES), challenge(""), runtime=runtime, workdir=tmp_path / "p")
    assert answer["answers"] == chains(SEED, 2, 40)
    assert answer["memory_mib"] == 16 and answer["gpus"] == []


def test_the_agent_runs_a_requested_probe_and_posts_its_result(
    tmp_path, control_plane, docker_runtime, test_image
):
    probe = next(PROBES)
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
