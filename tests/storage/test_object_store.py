"""End to end with a tenant's own bucket (docs/storage.md, "Object stores"): the whole stack of
tests/e2e/conftest.py (the control plane over HTTP, a real agent running jobs on the Docker
engine) and the local S3 server over HTTP (tests/storage/s3server.py). A job reads an s3://
input and writes its outputs to an s3:// destination; the tenant reads them back with boto3
and compares their digests. The bucket's credentials reach no container, log, event or API
answer. Outputs of destination "" land in the control plane's own bucket when Django's storage
is the S3 backend (OUTPUTS_TO_OBJECT_STORE)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import requests
from django.test import override_settings

from jobs import object_store
from jobs.models import Job, JobOutput
from pools.actors import Actor
from pools.models import TenantBucket
from pools.services import bucket_register, bucket_remove
from pools.statemachine import Refusal
from tests.e2e import conftest as e2e
from tests.storage.s3server import (
    ACCESS_KEY_ID,
    REGION,
    SECRET_ACCESS_KEY,
    STORE,
    new_bucket,
    registered_bucket,
    s3_client,
)

pytestmark = pytest.mark.docker
# the e2e stack's fixtures (tests/e2e/conftest.py), for this module
stack, e2e_database, _database = e2e.stack, e2e.e2e_database, e2e._database

CREDENTIALS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY)


@pytest.fixture(scope="module")
def bucket(stack, django_db_blocker):
    """The tenant's bucket, registered over HTTP by a tenant admin."""
    yield from registered_bucket(stack, django_db_blocker, "e2e")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_job_reads_an_s3_input_and_writes_its_outputs_to_the_tenants_bucket(stack, bucket):
    s3 = s3_client()
    data = os.urandom(200_000)
    s3.put_object(Bucket=bucket, Key="data/in.bin", Body=data)
    script = (
        "sleep 2; "  # time to look at the running container from outside
        "sha256sum /inputs/in.bin | cut -d' ' -f1 > /outputs/in.sha256; "
        "cat /inputs/in.bin /inputs/in.bin > /outputs/double.bin; "
        "env > /outputs/env.txt; "
        # every small file the container sees (its root, /run, /tmp, /inputs): grepped below
        "find / -xdev -type f -size -4096k 2>/dev/null | xargs cat > /outputs/files.bin "
        "2>/dev/null; cat /proc/1/environ /inputs/* >> /outputs/files.bin; "
        "echo wrote outputs"
    )
    response = stack.submit(
        "s3-io",
        ["sh", "-c", script],
        inputs=[f"s3://{bucket}/data/in.bin"],
        output_destination=f"s3://{bucket}/results",
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert response.json()["output_destination"] == f"s3://{bucket}/results/"

    stack.drive(job_id, "running", timeout=60)
    inspected = [
        json.dumps(stack.docker.api.inspect_container(c.id)) for c in stack.containers(job_id)
    ]
    assert inspected, "the job's container was not found while it ran"
    job = stack.drive(job_id, lambda j: j["state"] in ("succeeded", "failed"), timeout=90)
    assert job["state"] == "succeeded", (stack.reasons(job_id), stack.agent.tail())

    # the outputs API lists them with their location; the tenant fetches from its bucket
    listed = stack.api("GET", f"jobs/{job_id}/outputs")
    outputs = {o["name"]: o for o in listed.json()}
    assert set(outputs) == {"in.sha256", "double.bin", "env.txt", "files.bin"}
    for name, output in outputs.items():
        key = f"results/{job_id}/1/{name}"
        assert output["location"] == f"s3://{bucket}/{key}"
        body = s3.get_object(Bucket=bucket, Key=key)
        content = body["Body"].read()
        assert (len(content), sha(content)) == (output["size"], output["sha256"]), name
        assert body["Metadata"]["sha256"] == output["sha256"]  # travelled as metadata
        # requested; moto only echoes the header back (it encrypts nothing)
        assert body.get("ServerSideEncryption") == "AES256"
    double = s3.get_object(Bucket=bucket, Key=f"results/{job_id}/1/double.bin")["Body"].read()
    assert double == data + data
    in_sha = s3.get_object(Bucket=bucket, Key=f"results/{job_id}/1/in.sha256")["Body"].read()
    assert in_sha.decode().strip() == sha(data)
    rows = JobOutput.objects.filter(job_id=job_id)
    assert all(row.location and not row.file for row in rows)

    # a download explains where the output is, never a 500
    download = stack.api("GET", f"jobs/{job_id}/outputs/double.bin")
    assert download.status_code == 409
    assert download.json()["code"] == "output_in_object_store"
    assert download.json()["location"] == outputs["double.bin"]["location"]

    # the credential is nowhere: the container (inspect, env, files), logs, events, answers
    seen = {
        "docker inspect": "\n".join(inspected),
        "the container's env": s3.get_object(Bucket=bucket, Key=f"results/{job_id}/1/env.txt")[
            "Body"
        ]
        .read()
        .decode(errors="replace"),
        "the container's files": s3.get_object(Bucket=bucket, Key=f"results/{job_id}/1/files.bin")[
            "Body"
        ]
        .read()
        .decode(errors="replace"),
        "the job log": stack.api("GET", f"jobs/{job_id}/logs").text,
        "the job's events": stack.api("GET", f"jobs/{job_id}/events").text,
        "the job": stack.api("GET", f"jobs/{job_id}").text,
        "the outputs": listed.text,
        "the download": download.text,
        "the buckets": stack.api("GET", "buckets").text,
    }
    assert "wrote outputs" in seen["the job log"]
    assert len(seen["the container's files"]) > 100_000  # it did read the files it sees
    for where, text in seen.items():
        for credential in CREDENTIALS:
            assert credential not in text, f"{where} holds a credential of the bucket"
    # the agent's own log: the secret never (the key id is in every presigned URL it gets,
    # which it never logs)
    agent_log = stack.agent.log.read_text()
    for credential in CREDENTIALS:
        assert credential not in agent_log


def test_an_output_that_is_not_what_was_announced_is_refused_and_removed(stack, bucket):
    """The HEAD check: an object whose size or sha256 differs from the announcement is not
    recorded, and is deleted from the bucket."""
    s3 = s3_client()
    response = stack.submit(
        "s3-check",
        ["sh", "-c", "echo ok > /outputs/ok.txt"],
        output_destination=f"s3://{bucket}/chk",
    )
    job_id = response.json()["id"]
    stack.drive(job_id, "succeeded", timeout=90)
    job = Job.objects.get(pk=job_id)
    content = b"twelve bytes"
    signed = object_store.output_presign(
        job=job, attempt=1, name="x.bin", size=len(content), sha256=sha(content)
    )
    assert signed["location"] == f"s3://{bucket}/chk/{job_id}/1/x.bin"
    assert "X-Amz-Expires=900" in signed["url"]
    assert (
        "content-length%3Bhost%3Bx-amz-meta-sha256%3Bx-amz-server-side-encryption" in signed["url"]
    )
    put = requests.put(signed["url"], data=content, headers=signed["headers"], timeout=10)
    assert put.status_code == 200
    with pytest.raises(Refusal) as refused:
        object_store.output_record(job=job, attempt=1, name="x.bin", size=99, sha256=sha(content))
    assert refused.value.code == "output_mismatch"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="chk/").get("Contents", [])]
    assert f"chk/{job_id}/1/x.bin" not in keys  # removed
    assert f"chk/{job_id}/1/ok.txt" in keys
    assert not JobOutput.objects.filter(job_id=job_id, name="x.bin").exists()


def test_an_input_of_a_removed_bucket_fails_the_job_with_its_reason(
    stack, bucket, django_db_blocker
):
    spare = new_bucket("gone")
    s3_client().put_object(Bucket=spare, Key="w.bin", Body=b"w")
    actor = Actor.system("e2e")
    bucket_register(
        tenant=stack.tenant,
        bucket=spare,
        endpoint=STORE,
        region=REGION,
        access_key_id=ACCESS_KEY_ID,
        secret_access_key=SECRET_ACCESS_KEY,
        actor=actor,
    )
    response = stack.submit("s3-gone", ["true"], inputs=[f"s3://{spare}/w.bin"])
    assert response.status_code == 201, response.text
    bucket_remove(row=TenantBucket.objects.get(bucket=spare), actor=actor)
    job = stack.drive(response.json()["id"], "failed", timeout=60)
    assert "input_unavailable" in stack.reasons(job["id"])


def test_outputs_of_the_control_plane_land_in_its_own_bucket_under_the_s3_backend(stack, bucket):
    """OUTPUTS_TO_OBJECT_STORE: Django's default storage is django-storages' S3 backend on the
    control plane's bucket; an output of destination "" is stored there and downloads whole."""
    own = new_bucket("cp-own")
    storages = {
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "endpoint_url": STORE,
                "region_name": REGION,
                "access_key": "cp-access",
                "secret_key": "cp-secret",
                "bucket_name": own,
                "addressing_style": "path",
                "signature_version": "s3v4",
                "default_acl": None,
                "file_overwrite": False,
                "object_parameters": {"ServerSideEncryption": "AES256"},
            },
        },
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    with override_settings(STORAGES=storages):
        job_id = stack.submit("cp-s3", ["sh", "-c", "echo into the cp bucket > /outputs/cp.txt"])
        job_id = job_id.json()["id"]
        stack.drive(job_id, "succeeded", timeout=90)
        output = JobOutput.objects.get(job_id=job_id, name="cp.txt")
        assert output.location == "" and output.file.name.startswith(f"outputs/{job_id}/")
        keys = [o["Key"] for o in s3_client().list_objects_v2(Bucket=own)["Contents"]]
        assert keys == [output.file.name]
        download = stack.api("GET", f"jobs/{job_id}/outputs/cp.txt")
        assert download.status_code == 200
        assert download.content == b"into the cp bucket\n"
        assert sha(download.content) == output.sha256
