"""Persistent volumes end to end (tests/e2e/conftest.py `stack`: the live control plane, a
real agent process, the real Docker engine, real loop devices): a second job mounts the first
one's volume and reads what it wrote; writing past a volume's size is ENOSPC; retention
removes what expired (the image on the node too) and nothing else."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from storage import services
from storage.models import Volume
from tests.e2e.conftest import _database, e2e_database, stack  # noqa: F401 (fixtures)
from worker_agent.runtime import disks

pytestmark = pytest.mark.docker


def volume(stack, name, size_mib):  # noqa: F811
    body = {"tenant": stack.tenant.slug, "pool": stack.pool.slug, "name": name}
    response = stack.api("POST", "volumes", json=body | {"size_mib": size_mib})
    assert response.status_code == 201, response.text
    return response.json()


def run(stack, name, script, mounts):  # noqa: F811
    response = stack.submit(name, ["sh", "-c", script], volumes=mounts)
    assert response.status_code == 201, response.text
    job = stack.drive(response.json()["id"], lambda j: j["state"] in ("succeeded", "failed"))
    logs = stack.api("GET", f"jobs/{job['id']}/logs", params={"tail": 50}).text
    return job, logs


def image_of(stack, volume_id):  # noqa: F811
    work = stack.agent.state_dir.with_name(stack.agent.state_dir.name + ".work")
    return work / "volumes" / f"{volume_id}.img"


def test_a_second_job_reads_what_the_first_wrote_and_a_full_volume_is_enospc(stack):  # noqa: F811
    data = volume(stack, "e2e-data", 16)
    rw = [{"volume": data["id"], "path": "/data", "read_only": False}]
    job, logs = run(stack, "writer", "echo kept-across-jobs > /data/note; sync", rw)
    assert job["state"] == "succeeded", logs
    ro = [{"volume": data["id"], "path": "/data", "read_only": True}]
    script = "cat /data/note; touch /data/x 2>/dev/null && echo WROTE || echo read-only"
    job, logs = run(stack, "reader", script, ro)
    assert job["state"] == "succeeded" and "kept-across-jobs" in logs and "read-only" in logs
    assert "WROTE" not in logs
    # past its size: ENOSPC inside the container, the image holds at most its size
    script = "dd if=/dev/zero of=/data/big bs=1M count=64; echo rc=$?"
    job, logs = run(stack, "filler", script, rw)
    assert "No space left on device" in logs and "rc=1" in logs, logs
    assert image_of(stack, data["id"]).stat().st_blocks * 512 <= 16 * 1024 * 1024
    reasons = [e["reason"] for e in stack.api("GET", f"volumes/{data['id']}/events").json()]
    assert reasons[:3] == ["volume_created", "volume_attached", "volume_detached"]


def test_retention_removes_what_expired_and_nothing_else(stack):  # noqa: F811
    old, kept = volume(stack, "e2e-old", 8), volume(stack, "e2e-kept", 8)
    for v in (old, kept):  # each made on the node by a job
        job, logs = run(stack, f"touch-{v['id']}", "echo x > /v/f", [
            {"volume": v["id"], "path": "/v", "read_only": False}
        ])  # fmt: skip
        assert job["state"] == "succeeded", logs
        assert image_of(stack, v["id"]).exists()
    # "old" was detached more than its retention ago, "kept" not (30 days from now)
    now = timezone.now()
    Volume.objects.filter(pk=old["id"]).update(expires_at=now - timedelta(seconds=1))
    Volume.objects.filter(pk=kept["id"]).update(expires_at=now + timedelta(days=30))
    assert services.expire_volumes(now=now) == 1
    deadline = time.monotonic() + 20
    while image_of(stack, old["id"]).exists() and time.monotonic() < deadline:
        time.sleep(0.3)  # the agent's next heartbeat reports it and is told to remove it
    assert not image_of(stack, old["id"]).exists()
    assert image_of(stack, kept["id"]).exists()
    mounted = disks.mounted_below(image_of(stack, old["id"]).parent)
    assert image_of(stack, old["id"]).with_suffix("") not in mounted
    deadline = time.monotonic() + 10
    while Volume.objects.get(pk=old["id"]).disk_released_at is None:
        assert time.monotonic() < deadline, "the node's disk was not given back"
        time.sleep(0.3)
    states = dict(Volume.objects.filter(pk__in=[old["id"], kept["id"]]).values_list("pk", "state"))
    assert states == {old["id"]: "expired", kept["id"]: "available"}
