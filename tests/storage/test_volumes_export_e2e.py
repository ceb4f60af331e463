"""A volume exported end to end (tests/e2e/conftest.py `stack`: the live control plane, a real
agent, the real Docker engine and loop devices; the local S3 server of
tests/storage/s3server.py): a job writes files into a volume, in a folder too; the export job
tars the volume into the tenant's bucket; the tenant reads the object back with boto3 and finds
the files the first job wrote."""

import io
import tarfile

import pytest

from tests.e2e.conftest import _database, e2e_database, stack  # noqa: F401 (fixtures)
from tests.storage.s3server import (
    registered_bucket,
    s3_client,
)

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def bucket(stack, django_db_blocker):  # noqa: F811
    """The tenant's bucket, registered over HTTP by a tenant admin."""
    yield from registered_bucket(stack, django_db_blocker, "vexp")


def ended(job) -> bool:
    return job["state"] in ("succeeded", "failed")


def test_an_exported_volume_is_a_tar_in_the_tenants_bucket_with_what_a_job_wrote(
    stack,  # noqa: F811
    bucket,
):
    body = {"tenant": stack.tenant.slug, "pool": stack.pool.slug, "name": "e2e-export"}
    created = stack.api("POST", "volumes", json=body | {"size_mib": 16})
    assert created.status_code == 201, created.text
    volume = created.json()
    mounts = [{"volume": volume["id"], "path": "/data", "read_only": False}]
    script = "mkdir -p /data/sub && echo exported-note > /data/sub/note.txt && echo top > /data/t"
    writer = stack.submit("vexp-writer", ["sh", "-c", script + "; sync"], volumes=mounts)
    assert writer.status_code == 201, writer.text
    job = stack.drive(writer.json()["id"], ended, timeout=60)
    assert job["state"] == "succeeded", stack.reasons(job["id"])

    answer = stack.api(
        "POST", f"volumes/{volume['id']}/export", json={"destination": f"s3://{bucket}/backups"}
    )
    assert answer.status_code == 202, answer.text
    export_id = answer.json()["job"]
    job = stack.drive(export_id, ended, timeout=90)
    events = stack.api("GET", f"jobs/{export_id}/events").text
    assert job["state"] == "succeeded", (events[-1500:], stack.agent.tail())
    assert job["volumes"][0]["read_only"] is True

    key = f"backups/{export_id}/1/volume.tar"
    outputs = stack.api("GET", f"jobs/{export_id}/outputs").json()
    listed = outputs["results"] if isinstance(outputs, dict) else outputs
    assert [o["location"] for o in listed] == [f"s3://{bucket}/{key}"]
    data = s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = {m.name.removeprefix("./") for m in archive.getmembers()}
        assert {"sub", "sub/note.txt", "t"} <= names, names
        note = archive.extractfile(
            next(m for m in archive.getmembers() if m.name.endswith("sub/note.txt"))
        ).read()
    assert note == b"exported-note\n"
    reasons = [e["reason"] for e in stack.api("GET", f"volumes/{volume['id']}/events").json()]
    assert "volume_export_requested" in reasons
    assert reasons[-1] == "volume_detached"  # the export job let go of it when it ended
