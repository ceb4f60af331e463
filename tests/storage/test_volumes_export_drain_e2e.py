"""A volume exported end to end while its node is being drained (issue 23; tests/e2e/conftest.py
`stack`: the live control plane, a real agent, the real Docker engine and loop devices; the
local S3 server of tests/storage/s3server.py): a job writes into a volume, an operator drains
the node, the tenant exports the volume all the same — the export job, drain-exempt, is the one
job placed there — and the tar arrives in the tenant's bucket; a normal job that mounts the
volume is not placed. Once the export ended the drain completes. The node is made ready again
for the module's other tests."""

import io
import tarfile

import pytest

from config.builders import SYSTEM
from jobs.models import Job
from leases.selectors import ledger_problems
from nodes import services as node_services
from scheduling import drain
from tests.e2e.conftest import _database, e2e_database, stack  # noqa: F401 (fixtures)
from tests.storage.s3server import (
    registered_bucket,
    s3_client,
)

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def bucket(stack, django_db_blocker):  # noqa: F811
    """The tenant's bucket, registered over HTTP by a tenant admin."""
    yield from registered_bucket(stack, django_db_blocker, "vdrn")


def ended(job) -> bool:
    return job["state"] in ("succeeded", "failed")


def test_a_volume_on_a_draining_node_is_exported_and_the_drain_then_completes(
    stack,  # noqa: F811
    bucket,
):
    body = {"tenant": stack.tenant.slug, "pool": stack.pool.slug, "name": "e2e-rescue"}
    created = stack.api("POST", "volumes", json=body | {"size_mib": 16})
    assert created.status_code == 201, created.text
    volume = created.json()
    mounts = [{"volume": volume["id"], "path": "/data", "read_only": False}]
    script = "mkdir -p /data/keep && echo rescued > /data/keep/note.txt; sync"
    writer = stack.submit("vdrn-writer", ["sh", "-c", script], volumes=mounts)
    assert writer.status_code == 201, writer.text
    job = stack.drive(writer.json()["id"], ended, timeout=60)
    assert job["state"] == "succeeded", stack.reasons(job["id"])

    node_services.node_drain(node=stack.node(), actor=SYSTEM, message="kernel upgrade")
    try:
        shown = stack.api("GET", f"volumes/{volume['id']}").json()
        assert shown["at_risk"] is True and shown["node_state"] == "draining", shown
        reader_mounts = [{"volume": volume["id"], "path": "/data", "read_only": True}]
        reader = stack.submit("vdrn-reader", ["cat", "/data/keep/note.txt"], volumes=reader_mounts)
        assert reader.status_code == 201, reader.text

        answer = stack.api(
            "POST", f"volumes/{volume['id']}/export", json={"destination": f"s3://{bucket}/rescue"}
        )
        assert answer.status_code == 202, answer.text
        export_id = answer.json()["job"]
        job = stack.drive(export_id, ended, timeout=90)
        events = stack.api("GET", f"jobs/{export_id}/events").text
        assert job["state"] == "succeeded", (events[-1500:], stack.agent.tail())
        assert Job.objects.get(pk=export_id).leases.get().node_id == stack.node().pk

        key = f"rescue/{export_id}/1/volume.tar"
        data = s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("keep/note.txt"))
            assert archive.extractfile(member).read() == b"rescued\n"

        # the normal job that mounts the volume was never placed on the draining node
        waiting = stack.job(reader.json()["id"])
        assert waiting["state"] == "queued", waiting
        assert waiting["pending_reason"]["code"] == "volume_node_unavailable"
        assert ledger_problems(stack.pool) == []
        # the export ended: nothing holds the drain (the queued reader holds no lease)
        assert stack.node().pk in drain.node_drain_sweep()["completed"]
        stack.api("POST", f"jobs/{reader.json()['id']}/cancel")
    finally:
        node = stack.node()
        if node.state == "draining":
            node_services.node_drain_cancel(node=node, actor=SYSTEM)
