"""MPS on the node without a GPU: the daemon supervisor runs a stand-in for
`nvidia-cuda-mps-control` (a small script given by path that records its environment, its
/dev/shm and the commands sent to it) and for `nvidia-smi` (it records the compute modes
asked), since this machine has no driver. The container of an MPS lease is built by the real
Docker runtime and inspected without starting it (no GPU here to start it with). What only a
GPU shows — the CUDA client reaching the daemon, the caps holding, the OOM message — is not
tested here (docs/scheduler.md "What each sharing class isolates": not verified on hardware)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from worker_agent.mps import CONTAINER_PIPE_DIR, MpsDaemons, MpsShare, MpsUnavailable
from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import DockerRuntime, GVisorRuntime
from worker_agent.runtime.process import ProcessRuntime

from .conftest import IDS, make_owner

GPU_A = "GPU-0000000a-aaaa-bbbb-cccc-dddddddddddd"
GPU_B = "GPU-0000000b-aaaa-bbbb-cccc-dddddddddddd"

STAND_IN = """#!/bin/sh
# stands in for nvidia-cuda-mps-control: -f runs the daemon, no argument reads a command
log="$CUDA_MPS_LOG_DIRECTORY"
if [ "$1" = "-f" ]; then
  env > "$log/env.txt"
  ls -A /dev/shm > "$log/shm-before.txt"
  touch "/dev/shm/standin-$$"
  echo $$ > "$log/standin.pid"
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
  exec sleep 600
fi
read command
echo "$command" >> "$log/commands.txt"
[ "$command" = quit ] && kill "$(cat "$log/standin.pid")"
exit 0
"""


def script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def stand_in(tmp_path):
    smi_log = tmp_path / "smi.txt"
    control = script(tmp_path / "mps-control", STAND_IN)
    smi = script(tmp_path / "nvidia-smi", f'#!/bin/sh\necho "$@" >> {smi_log}\n')
    return control, smi, smi_log


@pytest.fixture
def daemons(tmp_path, stand_in):
    if os.geteuid() != 0:
        pytest.skip("the MPS daemon's own /dev/shm needs root (as the agent on a GPU node)")
    control, smi, _ = stand_in
    made = MpsDaemons(tmp_path / "run", tmp_path / "state" / "mps", control=control, smi=smi)
    yield made
    made.stop_all()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def recorded_env(log_dir) -> dict:
    lines = (log_dir / "env.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_one_daemon_per_gpu_with_its_own_environment_and_dev_shm(daemons, stand_in, tmp_path):
    _, _, smi_log = stand_in
    a = daemons.ensure(GPU_A)
    b = daemons.ensure(GPU_B)
    assert a.pipe_dir != b.pipe_dir and a.shm_dir != b.shm_dir
    logs = tmp_path / "state" / "mps"
    env = recorded_env(logs / GPU_A)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(a.pipe_dir)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(logs / GPU_A)  # under the state dir
    assert recorded_env(logs / GPU_B)["CUDA_VISIBLE_DEVICES"] == GPU_B
    # its /dev/shm is the GPU's own folder (what the job's container gets), not the host's
    pid = int((logs / GPU_A / "standin.pid").read_text())
    assert (a.shm_dir / f"standin-{pid}").exists()
    assert not os.path.exists(f"/dev/shm/standin-{pid}")
    assert (a.pipe_dir / "control").exists()
    assert oct(a.shm_dir.stat().st_mode & 0o7777) == "0o1777"
    assert f"-i {GPU_A} -c EXCLUSIVE_PROCESS" in smi_log.read_text()
    # asked again: the same daemon
    assert daemons.ensure(GPU_A) == a and daemons.running()[GPU_A] is not None


def test_a_gpu_without_mps_leases_left_has_its_daemon_stopped(daemons, stand_in, tmp_path):
    _, _, smi_log = stand_in
    daemons.ensure(GPU_A)
    daemons.ensure(GPU_B)
    pid_a = daemons.running()[GPU_A]
    daemons.retain({GPU_B})
    assert wait_gone(pid_a)
    assert set(daemons.running()) == {GPU_B}
    logs = tmp_path / "state" / "mps" / GPU_A
    assert (logs / "commands.txt").read_text().split() == ["quit"]  # asked to quit first
    assert f"-i {GPU_A} -c DEFAULT" in smi_log.read_text()
    daemons.stop_all()
    assert daemons.running() == {}


def test_a_daemon_that_died_is_started_again(daemons):
    daemons.ensure(GPU_A)
    first = daemons.running()[GPU_A]
    os.killpg(first, signal.SIGKILL)
    assert wait_gone(first)
    daemons.supervise()
    second = daemons.running()[GPU_A]
    assert second != first and alive(second)


def test_no_daemon_binary_is_mps_unavailable(tmp_path):
    missing = MpsDaemons(tmp_path / "run", tmp_path / "logs", control=str(tmp_path / "none"))
    with pytest.raises(MpsUnavailable, match=r"not installed|needs root"):
        missing.ensure(GPU_A)
    assert missing.running() == {}


def test_a_daemon_that_exits_at_start_is_mps_unavailable(daemons, tmp_path):
    daemons.control = script(tmp_path / "broken", "#!/bin/sh\necho cannot find a GPU\nexit 1\n")
    with pytest.raises(MpsUnavailable, match="exited: cannot find a GPU"):
        daemons.ensure(GPU_A)
    assert daemons.running() == {}


def test_caps_come_from_the_lease():
    [share] = MpsShare.parse_all([{"gpu": GPU_A, "milli": 5, "thread_percentage": 0}])
    assert share.thread_percentage == 1  # at least 1


# --------------------------------------------------------------------- the container


def mps_assignment(image, **limits) -> Assignment:
    job = next(IDS)
    return Assignment.parse(
        {
            "job": job,
            "attempt": 1,
            "lease": job + 7,
            "fencing_token": "123",
            "image": image,
            "command": ["true"],
            # the job's own env cannot lift its caps
            "env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"},
            "network_policy": {"mode": "none"},
            "limits": {
                "cpu_millicores": 500,
                "memory_mib": 64,
                "output_limit_mib": 16,
                "gpus": [GPU_A],
                "gpu_isolation": "shared-not-isolated",
                "mps": [{"gpu": GPU_A, "milli": 250, "thread_percentage": 25, "memory_mib": 20389}],
            }
            | limits,
        }
    )


@pytest.fixture
def docker_runtime(docker_client, daemons):
    runtime = DockerRuntime(make_owner("mps-node"), client=docker_client, mps=daemons)
    made = []
    original = runtime.create

    def create(a, workdir, fetcher=None):
        made.append(container := original(a, workdir, fetcher))
        return container

    runtime.create = create
    runtime.made = made
    yield runtime
    for container in made:
        runtime.remove(container)


@pytest.mark.docker
def test_an_mps_lease_s_container_has_its_caps_and_its_daemon_s_folders(
    docker_runtime, daemons, test_image, workdir
):
    a = mps_assignment(test_image)
    docker_runtime.pull(a)
    container = docker_runtime.create(a, workdir)  # created, never started: no GPU here
    container.reload()
    endpoint = daemons.ensure(GPU_A)
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    host = container.attrs["HostConfig"]
    mounts = {m["Target"]: m for m in host["Mounts"]}
    assert mounts[CONTAINER_PIPE_DIR]["Source"] == str(endpoint.pipe_dir)
    assert mounts["/dev/shm"]["Source"] == str(endpoint.shm_dir)
    assert host["IpcMode"] == "private"  # the daemon's shm folder, not the host's IPC
    [request] = host["DeviceRequests"]
    assert request["DeviceIDs"] == [GPU_A] and request["Driver"] == "nvidia"
    assert container.labels["computepool.mps"] == "1"
    assert container.labels["computepool.gpu_isolation"] == "shared-not-isolated"
    # nothing of the state dir (the daemon's logs) is mounted
    assert not any(str(daemons.log_root) in m["Source"] for m in host["Mounts"])


@pytest.mark.docker
def test_without_its_daemon_an_mps_lease_creates_nothing(docker_client, test_image, workdir):
    runtime = DockerRuntime(make_owner("mps-node"), client=docker_client, mps=None)
    a = mps_assignment(test_image)
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, workdir)
    assert failure.value.reason == "mps_unavailable"
    assert runtime.engine.get(runtime.container_name(a)) is None


@pytest.mark.docker
def test_a_missing_daemon_binary_fails_the_attempt_before_any_container(
    docker_client, test_image, workdir, tmp_path
):
    missing = MpsDaemons(tmp_path / "run", tmp_path / "logs", control=str(tmp_path / "none"))
    runtime = DockerRuntime(make_owner("mps-node"), client=docker_client, mps=missing)
    a = mps_assignment(test_image)
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, workdir)
    assert failure.value.reason == "mps_unavailable"
    assert runtime.engine.get(runtime.container_name(a)) is None


@pytest.mark.docker
def test_gvisor_and_the_process_runtime_refuse_mps_shares(docker_client, test_image, workdir):
    a = mps_assignment(test_image)
    gvisor = GVisorRuntime(make_owner("mps-node"), client=docker_client)
    with pytest.raises(RuntimeFailure) as refused:
        gvisor.create(a, workdir)
    assert refused.value.reason == "mps_unavailable"
    with pytest.raises(RuntimeFailure) as refused:
        ProcessRuntime(make_owner("mps-node"), work_dir=workdir).create(a, workdir)
    assert refused.value.reason == "mps_unavailable"


@pytest.mark.docker
def test_an_mps_job_that_ends_with_a_cuda_oom_says_so(docker_client, test_image):
    """The Docker runtime reads the end of an MPS container's output; the message is CUDA's
    (printed by the job here, as a CUDA program would at its cap)."""
    runtime = DockerRuntime(make_owner("mps-node"), client=docker_client)
    command = ["sh", "-c", "echo 'RuntimeError: CUDA error: out of memory' >&2; exit 1"]
    made = []
    try:
        for labels in ({"computepool.mps": "1"}, {}):
            container = docker_client.containers.create(test_image, command, labels=labels)
            made.append(container)
            container.start()
            container.wait(timeout=30)
            made[-1] = container
        mps_end, plain_end = (runtime.wait(c, 10) for c in made)
    finally:
        for container in made:
            container.remove(force=True)
    assert mps_end.reason == "gpu_memory_share_exceeded" and mps_end.exit_code == 1
    assert plain_end.reason == "exited_nonzero"
