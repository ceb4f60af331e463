"""Scratch on disk (issue 23, docs/storage.md "Scratch on disk"), end to end through the whole
stack (tests/e2e/conftest.py: a real agent process, the real Docker engine, real loop devices):
a job's /scratch is a disk-backed filesystem of its shape's size, nothing caps it at the job's
memory, writing past it is ENOSPC, and when the lease ends the node keeps no trace of it — not
when the job ends, nor when its agent was SIGKILLed mid-job and restarted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from nodes.models import Node
from tests.e2e.conftest import _database, e2e_database, stack  # noqa: F401
from worker_agent.runtime import disks

pytestmark = pytest.mark.docker

MEMORY_MIB = 64
SCRATCH_MIB = 256  # four times the memory


def submitted(stack, name, command, **fields) -> int:  # noqa: F811
    resources = {"cpu_millicores_min": 100, "memory_mib_min": MEMORY_MIB}
    response = stack.submit(name, command, resources=resources | fields.pop("resources", {}))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def work_root(stack) -> Path:  # noqa: F811
    return Path(f"{stack.agent.state_dir}.work")


def traces(stack, job_id: int) -> dict:  # noqa: F811
    """What the node still has of a job's disks: mounts below its work root, image files, the
    job's attempt directories."""
    root = work_root(stack)
    return {
        "mounts": [str(p) for p in disks.mounted_below(root)],
        "images": _below(root, lambda name: name.endswith(".img")),
        "attempts": [str(p) for p in (root / "attempts").glob(f"job{job_id}-a*")],
    }


def _below(root, match) -> list[str]:
    """Paths below `root` whose name matches, read while the agent may be removing them:
    os.walk skips a directory gone mid-walk (Path.rglob raised FileNotFoundError)."""
    return [
        os.path.join(folder, name)
        for folder, dirs, files in os.walk(root)
        for name in dirs + files
        if match(name)
    ]


def scratch_left(stack, job_id: int) -> list[str]:  # noqa: F811
    """Anything of the job's scratch: a mount, an image, a scratch folder in its attempt
    directories. (The runner that reports a swept attempt lost makes its directory again, empty
    of disks: not scratch.)"""
    left = traces(stack, job_id)
    found = left["mounts"] + left["images"]
    for attempt in left["attempts"]:
        found += _below(attempt, lambda name: "scratch" in name)
    return found


def logs(stack, job_id: int) -> str:  # noqa: F811
    return stack.api("GET", f"jobs/{job_id}/logs").text


def test_scratch_larger_than_memory_holds_more_than_memory_and_past_its_size_is_enospc(
    stack,  # noqa: F811
):
    script = (
        "df -m /scratch | tail -1; "
        # 160 MiB, more than twice the job's memory, written and synced to its disk
        "dd if=/dev/zero of=/scratch/big bs=1M count=160 conv=fsync 2>&1 | tail -1; "
        "echo wrote=$(wc -c < /scratch/big); "
        # then past the scratch's size: the filesystem refuses
        "dd if=/dev/zero of=/scratch/more bs=1M count=200 2>&1 | grep -o 'No space left on device'"
        "; sync"
    )
    job_id = submitted(
        stack, "scratch-over-memory", ["sh", "-c", script], resources={"scratch_mib": SCRATCH_MIB}
    )
    job = stack.drive(job_id, lambda j: j["state"] in ("succeeded", "failed"), timeout=90)
    text = logs(stack, job_id)
    assert job["state"] == "succeeded", (job, text)
    assert f"wrote={160 * 1024 * 1024}" in text  # more than twice the memory
    assert "No space left on device" in text
    # a filesystem of the shape's size (its own metadata takes a few percent)
    size_mib = int(text.splitlines()[0].split()[1])
    assert SCRATCH_MIB * 0.9 <= size_mib <= SCRATCH_MIB
    # when the lease ends, nothing of it is left on the node
    stack.drive(job_id, lambda j: not any(traces(stack, job_id).values()), timeout=20)


def test_scratch_of_an_agent_killed_mid_job_is_swept_when_it_restarts(stack):  # noqa: F811
    script = "dd if=/dev/zero of=/scratch/part bs=1M count=16 conv=fsync; echo ready; sleep 300"
    job_id = submitted(stack, "scratch-orphan", ["sh", "-c", script], resources={"scratch_mib": 64})
    stack.drive(job_id, "running", timeout=60)
    deadline = time.monotonic() + 30
    while not traces(stack, job_id)["mounts"] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = traces(stack, job_id)
    assert left["mounts"] and left["images"] and left["attempts"], left
    stack.agent.kill()  # SIGKILL: no clean-up at all
    for container in stack.containers(job_id):  # and its container is gone with the node's run
        stack.docker.containers.get(container.id).remove(force=True)
    assert traces(stack, job_id) == left  # the scratch outlived them both
    stack.agent.start()  # the restarted agent adopts nothing of it: swept
    stack.wait_ready()
    gone_by = time.monotonic() + 30
    while scratch_left(stack, job_id) and time.monotonic() < gone_by:
        time.sleep(0.3)
    assert not scratch_left(stack, job_id), traces(stack, job_id)
    # the job, lost with its container, ends (cancelled if it was not yet): the node is empty
    ended = ("succeeded", "failed", "cancelled", "lost")
    if stack.job(job_id)["state"] not in ended:
        stack.api("POST", f"jobs/{job_id}/cancel")
    stack.drive(job_id, lambda j: j["state"] in ended, timeout=30)


def test_the_node_reports_its_real_disk_and_scratch_never_exceeds_it(stack):  # noqa: F811
    """The agent's heartbeats carry its work root's disk (statvfs); the control plane's scratch
    is never more than that disk can hold."""
    deadline = time.monotonic() + 20
    node = stack.node()
    while node.disk_reported_at is None and time.monotonic() < deadline:
        time.sleep(0.3)
        node = stack.node()
    assert node.disk_reported_at is not None
    stats = os.statvfs(work_root(stack))
    assert node.disk_total_mib == stats.f_blocks * stats.f_frsize // (1024 * 1024)
    free_mib = stats.f_bavail * stats.f_frsize // (1024 * 1024)
    assert abs(node.disk_free_mib - free_mib) < 2048  # other tests write meanwhile
    assert node.scratch_mib_allocatable <= node.disk_free_mib + node.disk_held_mib
    assert Node.objects.get(pk=node.pk).scratch_mib_raw == node.disk_total_mib
