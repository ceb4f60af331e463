"""Issue 17: a job cannot fill the node's disk. /outputs is a filesystem of the job's
`output_limit_mib` and /scratch one of its scratch (on disk, not RAM): writing past either is
ENOSPC inside the container, and the node's disk holds no more than the limit. A node that
cannot make them refuses the job; a restarted agent removes what a gone attempt left. Each runs
on the real Docker engine, as root, with real loop devices."""

import os
import shutil

import pytest

from tests.worker_agent.conftest import (  # noqa: F401
    IDS,
    docker_client,
    make_owner,
    test_image,
)
from worker_agent.runtime import disks
from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.runtime.process import ProcessRuntime
from worker_agent.workroot import WorkRoot

MIB = 1024 * 1024


@pytest.fixture
def runtime(docker_client):  # noqa: F811
    return DockerRuntime(make_owner(), client=docker_client)


@pytest.fixture
def work(tmp_path):
    root = WorkRoot(tmp_path / "state.work", tmp_path / "state")
    yield root
    root.sweep()  # unmounts whatever a failed test left


def assignment(image, script, **limits) -> Assignment:
    job = next(IDS)
    return Assignment.parse(
        {
            "job": job,
            "lease": job + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["sh", "-c", script],
            "limits": {"cpu_millicores": 500, "memory_mib": 32, "pids": 64} | limits,
        }
    )


def run_to_end(runtime, a, workdir):
    (workdir / "inputs").mkdir(exist_ok=True)
    runtime.pull(a)
    container = runtime.create(a, workdir)
    try:
        runtime.start(container)
        ended = runtime.wait(container, timeout=60)
        assert ended is not None
        return ended, container.logs().decode()
    finally:
        runtime.remove(container)


def allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def test_writing_past_the_output_limit_is_enospc_and_the_node_keeps_its_disk(
    runtime,
    work,
    test_image,  # noqa: F811
):
    workdir = work.attempt_dir(next(IDS), 1)
    script = "dd if=/dev/zero of=/outputs/big bs=1M count=64; echo rc=$?; exit 3"
    ended, log = run_to_end(runtime, assignment(test_image, script, output_limit_mib=16), workdir)
    assert "No space left on device" in log and "rc=1" in log
    assert ended.exit_code == 3
    # the job's 64 MiB went nowhere: the image holds at most its 16 MiB
    assert allocated(workdir / "outputs.img") <= 16 * MIB
    assert os.path.getsize(workdir / "outputs" / "big") < 16 * MIB
    disks.release(workdir)
    assert not (workdir / "outputs.img").exists() and disks.mounted_below(workdir) == []


def test_scratch_is_a_disk_filesystem_of_its_size_not_ram(
    runtime,
    work,
    test_image,  # noqa: F811
):
    workdir = work.attempt_dir(next(IDS), 1)
    # 40 MiB in scratch under a 32 MiB memory limit: a tmpfs would be OOM-killed
    script = (
        "dd if=/dev/zero of=/scratch/fill bs=1M count=40 && echo fits; "
        "dd if=/dev/zero of=/scratch/more bs=1M count=64; echo rc=$?"
    )
    a = assignment(test_image, script, output_limit_mib=4, scratch_mib=48)
    ended, log = run_to_end(runtime, a, workdir)
    assert "fits" in log and "No space left on device" in log and "rc=1" in log
    assert ended.step == "succeeded" and ended.reason == "exited_zero"  # never OOM-killed
    assert allocated(workdir / "scratch.img") <= 48 * MIB


def test_a_node_that_cannot_make_the_filesystems_refuses_the_job(
    runtime,
    work,
    test_image,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    a = assignment(test_image, "echo ran > /outputs/x", output_limit_mib=4)
    runtime.pull(a)
    workdir = work.attempt_dir(a.job, 1)
    (workdir / "inputs").mkdir()
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no mkfs.ext4, mount, umount
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, workdir)
    assert failure.value.reason == "runtime_error"
    assert "disk limits cannot be enforced on this node" in failure.value.message
    monkeypatch.undo()
    assert not runtime.client.containers.list(all=True, filters={"name": runtime.container_name(a)})
    unlimited = assignment(test_image, "true", output_limit_mib=0)
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(unlimited, workdir)
    assert "no output limit" in failure.value.message


def test_the_process_runtime_refuses_a_limit_it_cannot_keep(tmp_path):
    runtime = ProcessRuntime(make_owner(), tmp_path / "work")
    for limits in ({"output_limit_mib": 16}, {"scratch_mib": 8}):
        a = assignment("", "true", **limits)
        with pytest.raises(RuntimeFailure) as failure:
            runtime.create(a, tmp_path)
        assert "disk limits cannot be enforced" in failure.value.message
    runtime.create(assignment("", "true", output_limit_mib=0), tmp_path)  # none promised


def test_a_restarted_agent_removes_the_filesystems_of_attempts_that_are_gone(work):
    kept, gone = work.attempt_dir(1, 1), work.attempt_dir(2, 1)
    for folder in (kept, gone):
        disks.make(folder / "outputs", 4)
        (folder / "outputs" / "file").write_text("x")
    assert work.sweep(keep={kept}) == [gone]
    assert not gone.exists()
    assert disks.mounted_below(work.dir) == [kept / "outputs"]
    assert (kept / "outputs" / "file").read_text() == "x"
    disks.release(kept)
    assert disks.mounted_below(work.dir) == [] and not (kept / "outputs.img").exists()
    shutil.rmtree(kept)
