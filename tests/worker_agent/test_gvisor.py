"""The gVisor runtime against the real engine: the Docker runtime's container, on the same create
path with every limit of the lease, under runsc (the runtimes .ci/ensure-services.sh registers):
the job sees gVisor's kernel, not the host's, and still ends as a Docker job would."""

import time

import pytest

from worker_agent.runtime.base import RuntimeFailure
from worker_agent.runtime.docker import OWNER_SUFFIX, DockerRuntime, GVisorRuntime

from .conftest import make_owner, require_service
from .test_checkpoint import TRAPPING, checkpoint_files, restore_of, wait_for
from .test_docker_runtime import assignment as docker_assignment
from .test_docker_runtime import run_to_end
from .test_network import gateway, netns, servers  # noqa: F401 (fixtures used below)
from .test_network import run as run_logged
from .test_runner import run as run_runner
from .test_secrets import root_only

pytestmark = pytest.mark.docker
SANDBOX_KERNEL = "4.4.0"  # what gVisor's Sentry answers to uname
# The pids limit counts the sandbox's own host threads too (runsc's ptrace platform: several per
# process of the job), so these jobs get the control plane's default of 1024, not 64.
LIMITS = {"cpu_millicores": 500, "memory_mib": 64, "scratch_mib": 8, "pids": 1024}


def assignment(image, command, limits=None, **changes):
    return docker_assignment(image, command, limits=LIMITS | (limits or {}), **changes)


def tracked(runtime):
    """`runtime`, removing every container it created when the test ends."""
    runtime.created = []
    original = runtime.create

    def create(a, workdir, fetcher=None):
        container = original(a, workdir, fetcher)
        runtime.created.append(container)
        return container

    runtime.create = create
    return runtime


@pytest.fixture
def owner():
    return make_owner("test-node-gvisor")  # both runtimes of a test are one agent's


@pytest.fixture
def runtime(docker_client, owner):
    require_service(GVisorRuntime.available(), "gVisor's runsc runtimes in dockerd")
    runtime = tracked(GVisorRuntime(owner, client=docker_client))
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


@pytest.fixture
def runc(docker_client, owner):
    runtime = tracked(DockerRuntime(owner, client=docker_client))
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


def test_the_same_container_as_dockers_with_only_the_engine_runtime_changed(
    runtime, runc, test_image, workdir
):
    a = assignment(test_image, ["true"])
    runtime.pull(a)
    sandboxed = runtime.create(a, workdir)
    runtime.remove(sandboxed)
    plain = runc.create(a, workdir)
    sandboxed_host = sandboxed.attrs["HostConfig"]
    plain_host = plain.attrs["HostConfig"]
    assert sandboxed_host["Runtime"] == "runsc-none" and plain_host["Runtime"] == "runc"
    ignored = {"Runtime", "Mounts"}  # mounts: volume names are the same, ids differ
    assert {k: v for k, v in sandboxed_host.items() if k not in ignored} == {
        k: v for k, v in plain_host.items() if k not in ignored
    }
    assert [m["Target"] for m in sandboxed_host["Mounts"]] == ["/outputs", "/inputs", "/scratch"]
    config = {k: v for k, v in sandboxed.attrs["Config"].items() if k != "Hostname"}
    assert config == {k: v for k, v in plain.attrs["Config"].items() if k != "Hostname"}
    assert sandboxed_host["NanoCpus"] == 500_000_000 and sandboxed_host["PidsLimit"] == 1024
    assert sandboxed_host["ReadonlyRootfs"] is True and sandboxed_host["CapDrop"] == ["ALL"]


def test_the_job_runs_on_gvisors_kernel_and_writes_its_outputs(runtime, test_image, workdir):
    script = "busybox uname -r > /outputs/kernel; busybox dmesg | busybox head -n 1; id -u"
    a = assignment(test_image, ["sh", "-c", script])
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.start(container)
    follower = runtime.logs(container)
    ended = run_to_end(runtime, container, start=False)
    assert (ended.step, ended.reason, ended.exit_code) == ("succeeded", "exited_zero", 0)
    assert (workdir / "outputs" / "kernel").read_text() == SANDBOX_KERNEL + "\n"
    follower.join()
    dmesg, uid = follower.take().splitlines()
    assert "Starting gVisor" in dmesg and uid == "65534"


@pytest.mark.parametrize(
    ("command", "limits"),
    [
        (["sh", "-c", "touch /bin/x"], {}),  # read-only root
        (["sh", "-c", "busybox dd if=/dev/zero of=/scratch/f bs=1M count=16"], {}),  # 8 MiB
        (
            ["sh", "-c", "busybox dd if=/dev/zero of=/outputs/f bs=1M count=32"],
            {"output_limit_mib": 16},
        ),
        (["sh", "-c", "for i in $(busybox seq 300); do sleep 5 & done"], {"pids": 256}),
    ],
    ids=["read-only-root", "scratch-size", "outputs-size", "pids"],
)
def test_the_leases_limits_hold_inside_the_sandbox(runtime, test_image, workdir, command, limits):
    a = assignment(test_image, command, limits=limits)
    ended = run_to_end(runtime, runtime.create(a, workdir), timeout=60)
    assert (ended.step, ended.reason) == ("failed", "exited_nonzero")


def test_a_memory_hog_is_oom_killed_under_gvisor(runtime, test_image, workdir):
    hog = ["sh", "-c", "x=a; while true; do x=$x$x; done"]
    a = assignment(test_image, hog, limits={"memory_mib": 32, "cpu_millicores": 1000})
    ended = run_to_end(runtime, runtime.create(a, workdir), timeout=60)
    assert (ended.step, ended.reason, ended.exit_code) == ("failed", "oom_killed", 137)


def test_a_pool_job_under_gvisor_reaches_only_its_allow_list(
    runtime,
    test_image,
    workdir,
    servers,  # noqa: F811
    gateway,  # noqa: F811
):
    allowed, other = servers
    # nc, not wget: busybox's wget fails over runsc's host network ("error getting response:
    # Resource temporarily unavailable", runsc 2022); nc and other clients work
    get = "printf 'GET / HTTP/1.0\\r\\n\\r\\n'"
    tries = (
        f"{get} | timeout 3 busybox nc {gateway} {port}; echo rc{n}=$?"
        for n, port in enumerate(servers, 1)
    )
    command = ["sh", "-c", "busybox uname -r; " + "; ".join(tries)]
    a = assignment(
        test_image,
        command,
        network_policy={"mode": "pool", "egress_allow": [f"{gateway}:{allowed}"]},
        pool_network={"egress_allowed": [gateway]},
    )
    container, logs = run_logged(runtime, a, workdir)
    assert logs.splitlines()[0] == SANDBOX_KERNEL
    assert f"hello from {allowed}" in logs and "rc1=0" in logs
    assert f"hello from {other}" not in logs and "rc2=0" not in logs
    # runsc passes through the owner's namespace (its egress rules), never the host's
    host = container.attrs["HostConfig"]
    owner = runtime.client.containers.get(container.name + OWNER_SUFFIX)
    assert host["Runtime"] == "runsc-netns" and host["NetworkMode"] == f"container:{owner.id}"


def test_each_runtime_finds_only_its_own_containers(runtime, runc, test_image, workdir):
    sandboxed = assignment(test_image, ["sleep", "30"])
    plain = assignment(test_image, ["sleep", "30"])
    runtime.pull(sandboxed)
    runtime.create(sandboxed, workdir)
    runc.create(plain, workdir)
    found_by_gvisor = {(f.job, f.lease) for f in runtime.find()}
    found_by_runc = {(f.job, f.lease) for f in runc.find()}
    assert sandboxed.key in found_by_gvisor - found_by_runc
    assert plain.key in found_by_runc - found_by_gvisor


def test_a_gpu_lease_is_refused_before_anything_is_created(runtime, test_image, workdir):
    a = assignment(test_image, ["true"], limits={"gpus": ["GPU-1234"]})
    with pytest.raises(RuntimeFailure) as refused:
        runtime.create(a, workdir)
    assert refused.value.reason == "runtime_unavailable"
    name = runtime.container_name(a)
    assert runtime.client.containers.list(all=True, filters={"name": name}) == []


@pytest.fixture
def gvisor_parts(agent_parts, runtime):
    """A runner's parts (conftest.agent_parts) with the gVisor runtime."""
    state, client, _ = agent_parts
    return state, client, runtime


def test_a_checkpoint_is_written_uploaded_and_restored_under_gvisor(
    gvisor_parts, control_plane, test_image
):
    """SIGUSR1 reaches the job in the sandbox; what it saves leaves through the engine's archive
    API, and the next attempt finds it in its $CHECKPOINT_DIR before it starts."""
    limits = LIMITS | {"scratch_mib": 0}
    first = run_runner(
        gvisor_parts, test_image, ["sh", "-c", TRAPPING], wait=False, stop_grace_s=10, limits=limits
    )
    wait_for(lambda: first.phase == "running")
    time.sleep(1)  # the trap is set before the shell's first sleep
    first.request_checkpoint()
    first.join(30)
    assert control_plane.steps(first.job)[-1] == ("checkpointed", "")
    archive = control_plane.outputs(first.job)["checkpoint.tar"]
    assert checkpoint_files(archive) == {"checkpoint/state": b"saved\n"}

    script = 'busybox uname -r; cat "$CHECKPOINT_DIR/state"'
    second = run_runner(
        gvisor_parts,
        test_image,
        ["sh", "-c", script],
        job=first.job,
        attempt=2,
        lease=first.assignment.lease + 1,
        restore=restore_of(archive),
        limits=limits,
    )
    assert control_plane.steps(second.job)[-1] == ("succeeded", "")
    assert control_plane.log_text(second.job).split() == [SANDBOX_KERNEL, "saved"]


@root_only  # the secrets' ramfs
def test_a_secret_is_a_file_of_the_jobs_user_inside_the_sandbox(runtime, test_image, workdir):
    """As under runc (tests/worker_agent/test_secrets.py): 0400, owned by the job's user, named
    by NAME_FILE; the value is in no environment variable of the sandboxed process."""
    script = 'busybox stat -c "%a %u" "$TOKEN_FILE"; cat "$TOKEN_FILE"; echo; busybox env'
    a = assignment(test_image, ["sh", "-c", script], secrets={"TOKEN": "s3cr3t-value-42"})
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.start(container)
    assert run_to_end(runtime, container, start=False).exit_code == 0
    mode, value, *environment = container.logs().decode().splitlines()
    assert (mode, value) == ("400 65534", "s3cr3t-value-42")
    assert "TOKEN_FILE=/run/secrets/TOKEN" in environment
    assert not any("s3cr3t" in line for line in environment)
