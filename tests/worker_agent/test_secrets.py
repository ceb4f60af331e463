"""The agent's secret files (worker_agent/runtime/secrets.py) on the real engine and the real
kernel: a per-attempt ramfs, its files 0400 owned by the job's user, unmounted on the host once
the container started (the container keeps reading it), swept when a dead agent left one."""

import os
from pathlib import Path

import pytest

from worker_agent.runtime import secrets as secret_files
from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import DockerRuntime, GVisorRuntime

from .conftest import IDS, make_owner, require_service

VALUE = "s3cr3t-for-the-agent"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a ramfs needs root")


def is_mount(path: Path) -> bool:
    return any(
        line.split()[4] == str(path)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def assignment(image, command, secrets) -> Assignment:
    job = next(IDS)
    return Assignment.parse(
        {
            "job": job,
            "lease": job + 7,
            "fencing_token": "1",
            "image": image,
            "command": command,
            "secrets": secrets,
            # gVisor counts its own threads against the pids limit: the default, not fewer
            "limits": {
                "cpu_millicores": 200,
                "memory_mib": 64,
                "pids": 1024,
                "output_limit_mib": 4,
            },
        }
    )


def test_the_assignment_never_shows_values_in_its_repr():
    a = Assignment.parse({"job": 1, "lease": 2, "fencing_token": "3", "secrets": {"A": VALUE}})
    assert VALUE not in repr(a)
    assert a.environment("/run/secrets") == {"A_FILE": "/run/secrets/A"}


@pytest.mark.parametrize("name", ["../x", "a/b", ".", "", "A.B", "x" * 129])
def test_a_name_that_is_not_a_plain_file_name_is_refused(tmp_path, name):
    with pytest.raises(RuntimeFailure, match="not a file name"):
        secret_files.write_files(tmp_path, {name: VALUE}, os.geteuid(), os.getegid())
    assert list(tmp_path.iterdir()) == []


def test_a_file_is_never_written_through_a_link(tmp_path):
    (tmp_path / "A").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        secret_files.write_files(tmp_path, {"A": VALUE}, os.geteuid(), os.getegid())
    assert not (tmp_path / "elsewhere").exists()


@root_only
def test_a_mount_is_ramfs_with_0400_files_of_the_job_user_and_a_sweep_removes_it(tmp_path):
    mounts = secret_files.HostMounts(tmp_path / "secrets")
    try:
        source = mounts.prepare("attempt-1", {"A": VALUE, "B": "other"}, 65534, 65534)
        assert is_mount(source)
        assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
        info = (source / "A").stat()
        assert (info.st_mode & 0o777, info.st_uid, info.st_gid) == (0o400, 65534, 65534)
        assert (source / "A").read_text() == VALUE
        assert mounts.sweep() == ["attempt-1"]  # what a dead agent left
        assert not is_mount(source) and not source.exists()
    finally:
        mounts.release("attempt-1")


@root_only
@pytest.mark.docker
@pytest.mark.parametrize("kind", [DockerRuntime, GVisorRuntime])
def test_the_container_reads_its_files_after_the_host_unmounted_them(
    docker_client, test_image, workdir, tmp_path, kind
):
    """runc's mount namespace, and gVisor's gofer, keep serving the bind mount after the host
    unmounted it."""
    if kind is GVisorRuntime:
        require_service(GVisorRuntime.available(), "gVisor (runsc-none, runsc-netns)")
    runtime = kind(make_owner(), client=docker_client, secrets_root=tmp_path / "s")
    a = assignment(test_image, ["sh", "-c", "sleep 1; cat /run/secrets/TOKEN"], {"TOKEN": VALUE})
    runtime.pull(a)
    container = runtime.create(a, workdir)
    try:
        [mount] = [m for m in container.attrs["Mounts"] if m["Destination"] == "/run/secrets"]
        source = Path(mount["Source"])
        assert is_mount(source)
        runtime.start(container)
        assert not is_mount(source) and not source.exists()  # before the job even read it
        ended = runtime.wait(container, timeout=30)
        assert ended is not None and ended.exit_code == 0
        assert container.logs().decode() == VALUE
    finally:
        runtime.remove(container)
    node_dir = tmp_path / "s" / runtime.owner.control_plane / str(runtime.owner.node_id)
    assert list(node_dir.iterdir()) == []  # nothing of the attempt is left on the host


@root_only
@pytest.mark.docker
def test_a_container_created_and_never_started_leaves_no_mount_when_removed(
    docker_client, test_image, workdir, tmp_path
):
    runtime = DockerRuntime(make_owner(), client=docker_client, secrets_root=tmp_path / "s")
    a = assignment(test_image, ["true"], {"TOKEN": VALUE})
    runtime.pull(a)
    container = runtime.create(a, workdir)
    source = Path(
        next(m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == "/run/secrets")
    )
    runtime.remove(container)
    assert not is_mount(source) and not source.exists()
