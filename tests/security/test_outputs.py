"""Issue 17: a job cannot make the agent read or write host files through what it leaves in
/outputs. The agent (root) reads outputs and checkpoints only through the engine's archive API
of the stopped container, uploads regular files only (each skip reported, with its reason),
and unpacks a restored checkpoint through the same API; the node credential lives in a state
directory that no job ever sees. Each attack runs on the real Docker engine."""

import hashlib
import io
import tarfile
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from config.builders import submit_job
from jobs import artifacts
from tests.clients import bearer_client
from tests.jobs.test_agent_api import place, run
from tests.worker_agent.conftest import (  # noqa: F401
    IDS,
    control_plane,
    docker_client,
    make_owner,
    test_image,
)
from worker_agent.client import ApiClient
from worker_agent.outputs import Outputs
from worker_agent.runner import Runner
from worker_agent.runtime import disks
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import DockerRuntime
from worker_agent.state import AgentState
from worker_agent.workroot import WorkRoot, WorkRootError

CREDENTIAL = "cpn_the-node-credential-must-never-leave"
LONG = "n" * 255  # the longest name a Linux file may have (bytes)


@pytest.fixture
def node(tmp_path, control_plane, docker_client):  # noqa: F811
    """The agent's parts as `make run` lays them out: a state dir holding the credential, the
    work root beside it, the Docker runtime."""
    control_plane.credential = CREDENTIAL
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": CREDENTIAL})
    work = WorkRoot(tmp_path / "state.work", state.dir)
    client = ApiClient(control_plane.url, state, backoff=0.01, retries=1)
    return state, work, client, DockerRuntime(make_owner(), client=docker_client)


def run_job(node, image, script, **changes) -> Runner:
    _, work, client, runtime = node
    job = next(IDS)
    data = {
        "job": job,
        "attempt": changes.pop("attempt", 1),
        "lease": job + 7,
        "fencing_token": "42",
        "image": image,
        "command": ["sh", "-c", script],
        "max_runtime_s": 60,
        "stop_grace_s": 1,
        "limits": {"cpu_millicores": 500, "memory_mib": 64, "pids": 64},
    } | changes
    data["limits"] = {"output_limit_mib": 64} | data["limits"]
    a = Assignment.parse(data)
    runner = Runner(
        a, client=client, runtime=runtime, workdir=work.attempt_dir(a.job, a.attempt), poll_s=0.2
    )
    runner.start()
    runner.join(90)
    assert not runner.is_alive(), "the agent hung on what the job left"
    return runner


def uploaded_bytes(control_plane, job) -> bytes:  # noqa: F811
    return b"".join(control_plane.outputs(job).values())


def members(archive: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def skipped(control_plane, job) -> dict:  # noqa: F811
    final = control_plane.reports(job)[-1]
    return {entry["name"]: entry["reason"] for entry in final.get("outputs_skipped", [])}


@pytest.mark.parametrize(
    "target",
    ["{state}", "{state}/", "../../../../../../..{state}", "/proc/1/root{state}"],
    ids=["absolute", "trailing-slash", "dot-dot", "proc-root"],
)
def test_a_checkpoint_folder_swapped_for_a_link_to_the_state_dir_leaks_nothing(
    node,
    control_plane,  # noqa: F811
    test_image,  # noqa: F811
    target,
):
    """The review's exploit: when the job ends the agent packs outputs/checkpoint as root."""
    state = node[0]
    link = target.format(state=state.dir)
    script = (
        f"rmdir /outputs/checkpoint && ln -s {link} /outputs/checkpoint && echo ok > /outputs/a"
    )
    runner = run_job(node, test_image, script)

    assert control_plane.steps(runner.job)[-1] == ("succeeded", "")
    outputs = control_plane.outputs(runner.job)
    assert set(outputs) == {"a"}  # no checkpoint.tar at all
    assert CREDENTIAL.encode() not in uploaded_bytes(control_plane, runner.job)
    assert skipped(control_plane, runner.job) == {"checkpoint": "symlink"}
    assert (state.dir / "credential").read_text() == CREDENTIAL  # untouched


def test_links_fifos_devices_and_hard_links_are_skipped_with_their_reason(
    node,
    control_plane,  # noqa: F811
    test_image,  # noqa: F811
):
    script = """set -e
cd /outputs
echo plain > a-plain
ln -s /etc/hostname absolute
ln -s ../../../../../etc dotdot
ln -s a-plain relative
ln a-plain hard
mkfifo fifo
mkdir folder && echo inside > folder/file && ln -s / folder/root
cd checkpoint
mkdir -p deep && echo state > deep/state
ln -s / deep/root
ln -s ../.. up
ln -s /etc/hostname absolute
ln deep/state hard
mkfifo fifo
"""
    runner = run_job(node, test_image, script)

    assert control_plane.steps(runner.job)[-1] == ("succeeded", "")
    outputs = control_plane.outputs(runner.job)
    assert set(outputs) == {"a-plain", "checkpoint.tar"}  # a hard link's first name is a file
    assert outputs["a-plain"] == b"plain\n"
    assert members(outputs["checkpoint.tar"]) == {"checkpoint/deep/state": b"state\n"}
    assert skipped(control_plane, runner.job) == {
        "absolute": "symlink",
        "dotdot": "symlink",
        "relative": "symlink",
        "hard": "hardlink",
        "fifo": "fifo",
        "folder": "directory",
        "checkpoint/absolute": "symlink",
        "checkpoint/deep/root": "symlink",
        "checkpoint/up": "symlink",
        "checkpoint/hard": "hardlink",
        "checkpoint/fifo": "fifo",
    }


def test_sparse_files_and_names_of_255_bytes_are_uploaded_as_they_are(
    node,
    control_plane,  # noqa: F811
    test_image,  # noqa: F811
):
    script = (
        f"truncate -s 4194304 /outputs/sparse && echo long > /outputs/{LONG} && "
        f"echo deep > /outputs/checkpoint/{LONG}"
    )
    runner = run_job(node, test_image, script)

    outputs = control_plane.outputs(runner.job)
    assert outputs["sparse"] == b"\0" * 4194304
    assert outputs[LONG] == b"long\n"
    assert members(outputs["checkpoint.tar"]) == {f"checkpoint/{LONG}": b"deep\n"}
    assert skipped(control_plane, runner.job) == {}


def test_a_huge_sparse_file_stops_the_reading_instead_of_streaming_zeros(
    node,
    control_plane,  # noqa: F811
    test_image,  # noqa: F811
    docker_client,  # noqa: F811
):
    """1 TiB of holes costs the job nothing; the agent reads no more than its budget."""
    _, work, client, runtime = node
    container = docker_client.containers.create(
        test_image,
        ["sh", "-c", "echo a > /outputs/a && truncate -s 1099511627776 /outputs/b-huge"],
        user="65534:65534",
        network_mode="none",
        mounts=[_outputs_mount(work)],
        labels={"computepool.test": "outputs"},
    )
    try:
        container.start()
        container.wait(timeout=30)
        outputs = Outputs(runtime, container, client, 1, "42", read_max=16 * 1024**2)
        started = time.monotonic()
        outputs.upload()
        assert time.monotonic() - started < 10
    finally:
        container.remove(force=True)
    assert outputs.uploaded == ["a"]
    assert outputs.skipped == [{"name": "b-huge", "reason": "read_limit"}]


def _outputs_mount(work):
    from docker.types import Mount

    folder = work.attempt_dir(next(IDS), 1) / "outputs"
    folder.mkdir()
    folder.chmod(0o777)
    return Mount("/outputs", str(folder), type="bind")


def tar_of(*entries) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, payload in entries:
            entry = tarfile.TarInfo(name)
            entry.type = kind
            if kind == tarfile.REGTYPE:
                entry.size = len(payload)
                tar.addfile(entry, io.BytesIO(payload))
            else:
                entry.linkname = payload
                tar.addfile(entry)
    return buffer.getvalue()


def test_a_hostile_checkpoint_is_restored_as_plain_files_of_the_job_only(
    node,
    control_plane,  # noqa: F811
    test_image,  # noqa: F811
    tmp_path,
):
    """A checkpoint.tar is a job's upload: its links, `..` and absolute paths never reach the
    node, and what is restored belongs to the job's user."""
    archive = tar_of(
        ("checkpoint/state", tarfile.REGTYPE, b"saved"),
        ("checkpoint/link", tarfile.SYMTYPE, str(tmp_path)),
        ("checkpoint/link/planted", tarfile.REGTYPE, b"through the link"),
        ("checkpoint/../../escaped", tarfile.REGTYPE, b"x"),
        (f"/{tmp_path}/absolute", tarfile.REGTYPE, b"x"),
        ("checkpoint/hard", tarfile.LNKTYPE, "checkpoint/state"),
        ("checkpoint/fifo", tarfile.FIFOTYPE, ""),
        ("checkpoint/dev", tarfile.CHRTYPE, ""),
    )
    job = next(IDS)
    control_plane.checkpoints[job] = archive
    restore = {"url": "", "sha256": hashlib.sha256(archive).hexdigest()}
    script = "cd /outputs/checkpoint && find . -exec stat -c '%n %F %u:%g' {} + | sort"
    runner = run_job(node, test_image, script, job=job, attempt=2, restore=restore)

    assert control_plane.steps(job)[-1] == ("succeeded", "")
    listing = control_plane.log_text(job).splitlines()
    assert listing == [
        ". directory 65534:65534",
        "./link directory 65534:65534",  # a folder of its own: the link was never made
        "./link/planted regular file 65534:65534",
        "./state regular file 65534:65534",
    ]
    found = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert not any("planted" in p or "escaped" in p or "absolute" in p for p in found)
    assert runner.outcome.step == "succeeded"


def test_the_state_dir_is_never_mounted_into_a_job(node, test_image, docker_client):  # noqa: F811
    state, work, _, runtime = node
    a = Assignment.parse(
        {
            "job": next(IDS),
            "lease": 1,
            "fencing_token": "1",
            "image": test_image,
            "command": ["true"],
            "limits": {"output_limit_mib": 4, "scratch_mib": 4},
        }
    )
    workdir = work.attempt_dir(a.job, 1)
    (workdir / "inputs").mkdir()
    container = runtime.create(a, workdir)
    try:
        sources = [m["Source"] for m in container.attrs["Mounts"]]
    finally:
        runtime.remove(container)
        disks.release(workdir)
    assert len(sources) == 3  # /outputs, /scratch and /inputs of the attempt, in the work root
    for source in map(Path, sources):
        assert work.dir in source.parents
        assert state.dir not in source.parents and source not in state.dir.parents
    with pytest.raises(WorkRootError):
        WorkRoot(state.dir / "attempts", state.dir)
    with pytest.raises(WorkRootError):
        WorkRoot(state.dir.parent, state.dir)


@pytest.mark.django_db
def test_an_output_name_of_255_bytes_can_be_uploaded_twice(agent, tenant):
    """The storage's suffix for a taken name made the path component longer than 255 bytes:
    a 500. The stored file's key no longer depends on the name."""
    api = bearer_client(agent.secret)
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(api, job, lease)
    url = f"/api/v1/agent/jobs/{job.pk}/outputs"
    for content in (b"first", b"second"):
        upload = SimpleUploadedFile(LONG, content)
        response = api.post(url, {"fencing_token": str(lease.fencing_token), "files": [upload]})
        assert response.status_code == 201, response.content
    [output] = job.outputs.all()
    assert output.name == LONG and artifacts.output_open(output).read() == b"second"
    unicode_name = "é" * 255  # 510 bytes: a name the database takes, no file system would
    upload = SimpleUploadedFile(unicode_name, b"x")
    response = api.post(url, {"fencing_token": str(lease.fencing_token), "files": [upload]})
    assert response.status_code == 201, response.content
