"""The Docker runtime against the real engine and the busybox test image (by digest): the
container's HostConfig carries every limit of the lease, and each way a container ends is told
apart (exit 0, exit 3, OOM-killed, killed at the maximum runtime, stopped)."""

import os
import time

import pytest

from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import DockerRuntime

from .conftest import IDS, make_owner

pytestmark = pytest.mark.docker


def assignment(image, command, **changes) -> Assignment:
    job = next(IDS)
    data = {
        "job": job,
        "attempt": 1,
        "lease": job + 7,
        "fencing_token": "123",
        "image": image,
        "command": command,
        "network_policy": {"mode": "none", "egress_allow": []},
        "limits": {"cpu_millicores": 500, "memory_mib": 64, "scratch_mib": 8, "pids": 64},
    } | changes
    data["limits"] = {"output_limit_mib": 16} | data["limits"]  # every job has one
    return Assignment.parse(data)


@pytest.fixture
def runtime(docker_client):
    runtime = DockerRuntime(make_owner("test-node"), client=docker_client)
    created = []
    runtime.created = created
    original = runtime.create

    def create(a, workdir, fetcher=None):
        container = original(a, workdir, fetcher)
        created.append(container)
        return container

    runtime.create = create
    yield runtime
    for container in created:
        runtime.remove(container)


def run_to_end(runtime, container, timeout=30, start=True):
    if start:
        runtime.start(container)
    ended = runtime.wait(container, timeout)
    assert ended is not None, "the container did not end"
    return ended


def test_the_container_has_exactly_the_leases_limits(runtime, test_image, workdir):
    a = assignment(test_image, ["true"])
    runtime.pull(a)
    container = runtime.create(a, workdir)
    container.reload()
    host = container.attrs["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 64 * 1024 * 1024  # no extra swap
    assert host["PidsLimit"] == 64
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert host["IpcMode"] == "private"
    assert host["PidMode"] == "" and host["UTSMode"] == "" and host["UsernsMode"] == ""
    assert container.attrs["Config"]["User"] == "65534:65534"
    assert container.attrs["Config"]["Image"] == test_image  # by digest
    mounts = {m["Target"]: m for m in host["Mounts"]}
    assert set(mounts) == {"/outputs", "/inputs", "/scratch"}
    assert mounts["/inputs"].get("ReadOnly") is True and not mounts["/outputs"].get("ReadOnly")
    assert mounts["/outputs"]["Source"] == str(workdir / "outputs")
    assert mounts["/scratch"]["Source"] == str(workdir / "scratch")
    everything = str(host.get("Binds")) + str(host["Mounts"])
    assert "docker.sock" not in everything
    # both are filesystems of their limits on the node's disk (not RAM), owned by the job
    for folder, size in (("outputs", 16), ("scratch", 8)):
        found = os.statvfs(workdir / folder)
        assert size * 1024 * 0.85 <= found.f_blocks * found.f_frsize / 1024 <= size * 1024
        assert (workdir / folder).stat().st_uid == 65534
        assert (workdir / f"{folder}.img").stat().st_size == size * 1024 * 1024
    labels = container.labels
    assert labels["computepool.job"] == str(a.job)
    assert labels["computepool.lease"] == str(a.lease)
    assert labels["computepool.attempt"] == "1"
    assert labels["computepool.node"] == "test-node"
    # its owner: the control plane's id and the node's id
    owner = runtime.owner
    assert labels["computepool.control_plane"] == owner.control_plane
    assert labels["computepool.node_id"] == str(owner.node_id)
    assert container.name == f"computepool-{owner.control_plane}-job{a.job}-l{a.lease}"
    assert labels["computepool.gpu_isolation"] == "none"  # no GPUs


def test_the_gpu_isolation_is_a_container_label(runtime, test_image, workdir):
    # time-slice/MPS shares are labelled as not isolated (GPUs themselves need NVIDIA's runtime)
    limits = {"memory_mib": 32, "pids": 16, "gpu_isolation": "shared-not-isolated"}
    container = runtime.create(assignment(test_image, ["true"], limits=limits), workdir)
    container.reload()
    assert container.labels["computepool.gpu_isolation"] == "shared-not-isolated"


def test_cpuset_and_gpus_follow_the_lease(runtime, test_image, workdir):
    a = assignment(
        test_image,
        ["true"],
        limits={"cpu_millicores": 1000, "memory_mib": 32, "cpuset": [0], "pids": 16},
    )
    container = runtime.create(a, workdir)
    container.reload()
    assert container.attrs["HostConfig"]["CpusetCpus"] == "0"
    # GPUs go as the exact device UUIDs (not created here: no NVIDIA runtime on this host)
    gpu = assignment(test_image, ["true"], limits={"gpus": ["GPU-1234", "MIG-abcd"]})
    assert gpu.limits.gpus == ("GPU-1234", "MIG-abcd")


def test_exit_zero_succeeds_and_outputs_land_in_the_attempt_dir(runtime, test_image, workdir):
    a = assignment(test_image, ["sh", "-c", "echo hello > /outputs/greeting.txt; id -u"])
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.start(container)
    follower = runtime.logs(container)  # from the start, even if it already ended
    ended = run_to_end(runtime, container, start=False)
    assert (ended.step, ended.reason, ended.exit_code) == ("succeeded", "exited_zero", 0)
    assert (workdir / "outputs" / "greeting.txt").read_text() == "hello\n"
    follower.join()
    assert follower.take().strip() == "65534"


def test_a_nonzero_exit_fails_with_its_code(runtime, test_image, workdir):
    container = runtime.create(assignment(test_image, ["sh", "-c", "exit 3"]), workdir)
    ended = run_to_end(runtime, container)
    assert (ended.step, ended.reason, ended.exit_code) == ("failed", "exited_nonzero", 3)


def test_the_root_filesystem_is_read_only(runtime, test_image, workdir):
    container = runtime.create(assignment(test_image, ["sh", "-c", "touch /bin/x"]), workdir)
    assert run_to_end(runtime, container).exit_code != 0


def test_a_memory_hog_is_oom_killed(runtime, test_image, workdir):
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    a = assignment(test_image, hog, limits={"memory_mib": 16, "cpu_millicores": 1000})
    ended = run_to_end(runtime, runtime.create(a, workdir), timeout=60)
    assert (ended.step, ended.reason) == ("failed", "oom_killed")
    assert ended.exit_code == 137


class FlagLost:
    """The container as Docker reports it when its OOM event lost the race with the exit event
    (cgroup v2, seen in CI): exit 137, OOMKilled false. Everything else is the real engine's."""

    def __init__(self, container):
        self.container = container

    def __getattr__(self, name):
        return getattr(self.container, name)

    def reload(self):
        self.container.reload()
        self.container.attrs["State"]["OOMKilled"] = False


def test_an_oom_kill_is_told_from_the_engines_event_log_when_the_flag_is_lost(
    runtime, test_image, workdir
):
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    a = assignment(test_image, hog, limits={"memory_mib": 16, "cpu_millicores": 1000})
    container = runtime.create(a, workdir)
    runtime.start(container)
    ended = run_to_end(runtime, FlagLost(container), timeout=60, start=False)
    assert (ended.reason, ended.exit_code) == ("oom_killed", 137)


def test_a_sigkill_that_is_not_an_oom_is_an_exit_137(runtime, test_image, workdir):
    # PID 1 cannot be sent SIGKILL from inside; its child can, and sh exits with its status.
    killed = ["sh", "-c", "sleep 30 & kill -9 $!; wait $!"]
    container = runtime.create(assignment(test_image, killed), workdir)
    ended = run_to_end(runtime, container)
    assert (ended.step, ended.reason, ended.exit_code) == ("failed", "exited_nonzero", 137)


def test_a_stop_gives_the_grace_period_then_kills(runtime, test_image, workdir):
    container = runtime.create(assignment(test_image, ["sleep", "60"]), workdir)
    runtime.start(container)
    assert runtime.wait(container) is None  # it runs
    started = time.monotonic()
    runtime.stop(container, 1)
    assert time.monotonic() - started < 15
    assert runtime.wait(container) is not None


def test_images_only_by_digest(runtime, test_image):
    tag = test_image.split("@")[0] + ":test"
    with pytest.raises(RuntimeFailure) as refused:
        runtime.pull(assignment(tag, ["true"]))
    assert refused.value.reason == "image_invalid"


def test_a_missing_image_is_invalid(runtime, test_image):
    missing = test_image.split("@")[0] + "@sha256:" + "0" * 64
    with pytest.raises(RuntimeFailure) as refused:
        runtime.pull(assignment(missing, ["true"]))
    assert refused.value.reason == "image_invalid"


def test_the_local_cache_is_listed_by_digest(runtime, test_image):
    runtime.pull(assignment(test_image, ["true"]))
    assert test_image.split("@")[1] in runtime.images()


def test_containers_are_found_again_by_label(runtime, test_image, workdir):
    a = assignment(test_image, ["sleep", "30"])
    container = runtime.create(a, workdir)
    runtime.start(container)
    found = {(f.job, f.lease): f for f in runtime.find()}
    assert found[a.key].running and found[a.key].attempt == 1
    runtime.stop(container, 0)  # killed
    found = {(f.job, f.lease): f for f in runtime.find()}
    assert not found[a.key].running and found[a.key].ended.exit_code == 137


def test_a_mig_instance_this_node_cannot_name_is_refused_before_anything_is_created(
    docker_client, test_image, workdir
):
    """Without NVML (no driver here) a leased MIG slice cannot be mapped to its device: the
    attempt fails with runtime_error and leaves no container, volume or network owner."""
    runtime = DockerRuntime(make_owner("test-node"), client=docker_client)
    a = assignment(test_image, ["true"], limits={"gpus": ["MIG-GPU-abc/4/0"]})
    name = runtime.container_name(a)
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create(a, workdir)
    assert refused.value.reason == "runtime_error"
    assert "MIG" in refused.value.message
    # nothing of this attempt exists (other tests' containers come and go meanwhile)
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert docker_client.volumes.list(filters={"name": f"{name}-scratch"}) == []
