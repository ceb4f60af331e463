"""Outputs at rest are encrypted per tenant (jobs/encryption_at_rest.py, docs/storage.md
"Encryption at rest and retention"): the stored file is ciphertext, read directly from the
storage; a download gives back the exact bytes; a file altered, truncated or reordered does
not open; the key ring's rotation re-wraps the data keys and leaves the files as they are."""

import hashlib
import io
import os
import struct
import tarfile

import pytest
from django.core.files.storage import default_storage
from django.core.management import call_command
from django.test import override_settings

from config.builders import submit_job
from jobs import artifacts
from jobs.encryption_at_rest import (
    CHUNK_BYTES,
    HEADER,
    MAGIC,
    TAG_BYTES,
    OutputUnreadable,
    data_key_for,
)
from jobs.models import JobOutput, TenantDataKey
from nodes import services as node_services
from pools import encryption
from pools.actors import Actor
from tests.clients import bearer_client
from tests.jobs.test_agent_api import place

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def job(pool, tenant):
    return submit_job(pool, tenant)


def multi_chunk() -> bytes:
    """3.5 chunks: a PNG header, then text a reader would recognise, then random bytes."""
    text = b"the quick brown fox jumps over the lazy dog\n" * (CHUNK_BYTES // 44)
    return PNG + text + os.urandom(CHUNK_BYTES * 2 + CHUNK_BYTES // 2 - len(PNG))


def store(job, data: bytes, name="model.png") -> JobOutput:
    return artifacts.job_output_store(job=job, attempt=1, name=name, fileobj=io.BytesIO(data))


def test_the_stored_file_is_ciphertext_and_the_download_the_exact_bytes(api, member, job, media):
    data = multi_chunk()
    output = store(job, data)
    assert output.size == len(data) and output.sha256 == hashlib.sha256(data).hexdigest()

    stored = (media / output.file.name).read_bytes()  # the storage's own bytes
    assert stored.startswith(MAGIC)
    chunks = -(-len(data) // CHUNK_BYTES)
    assert len(stored) == HEADER.size + len(data) + chunks * TAG_BYTES
    assert PNG not in stored and b"\x89PNG" not in stored
    assert b"the quick brown fox" not in stored and b"lazy dog" not in stored
    for at in range(0, len(data), 97_003):  # no 32-byte run of the plaintext anywhere
        assert data[at : at + 32] not in stored

    response = api(member).get(f"/api/v1/jobs/{job.pk}/outputs/model.png")
    assert response.status_code == 200
    assert response["Content-Length"] == str(len(data))
    body = b"".join(response.streaming_content)
    assert body == data
    assert hashlib.sha256(body).hexdigest() == response["X-Checksum-Sha256"] == output.sha256


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1])
def test_every_size_at_a_chunk_boundary_round_trips(job, size):
    data = os.urandom(size)
    output = store(job, data)
    with artifacts.output_open(output) as stream:
        assert stream.read() == data


def test_each_tenant_has_its_own_data_key_wrapped_by_the_ring(pool, tenant, other_tenant):
    mine, theirs = submit_job(pool, tenant), submit_job(pool, other_tenant)
    a, b = store(mine, b"alpha" * 100), store(theirs, b"beta" * 100)
    assert a.data_key.tenant_id == tenant.pk and b.data_key.tenant_id == other_tenant.pk
    assert a.data_key_id != b.data_key_id
    assert store(mine, b"again", "other.bin").data_key_id == a.data_key_id  # made once
    key = TenantDataKey.objects.get(pk=a.data_key_id)
    assert key.key_id == encryption.current_key_id() and len(bytes(key.wrapped)) == 12 + 44 + 16
    # a row pointing at another tenant's key does not open, even with the right file
    JobOutput.objects.filter(pk=a.pk).update(data_key=b.data_key)
    with pytest.raises(OutputUnreadable):
        artifacts.output_open(JobOutput.objects.get(pk=a.pk))


def _rewrite(media, output, change):
    path = media / output.file.name
    path.write_bytes(change(path.read_bytes()))


SEALED = CHUNK_BYTES + TAG_BYTES


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda b: b[:-1], id="last byte cut"),
        pytest.param(lambda b: b[: HEADER.size + 2 * SEALED], id="cut at a chunk boundary"),
        pytest.param(lambda b: b + b"\x00" * TAG_BYTES, id="bytes appended"),
        pytest.param(
            lambda b: (
                b[: HEADER.size]
                + b[HEADER.size + SEALED : HEADER.size + 2 * SEALED]
                + b[HEADER.size : HEADER.size + SEALED]
                + b[HEADER.size + 2 * SEALED :]
            ),
            id="chunks 0 and 1 swapped",
        ),
        pytest.param(
            lambda b: (
                b[: HEADER.size + SEALED + 5]
                + bytes([b[HEADER.size + SEALED + 5] ^ 1])
                + b[HEADER.size + SEALED + 6 :]
            ),
            id="a bit of chunk 1 flipped",
        ),
    ],
)
def test_an_altered_file_does_not_open(job, media, change):
    output = store(job, multi_chunk())
    _rewrite(media, output, change)
    with pytest.raises(OutputUnreadable), artifacts.output_open(output) as stream:
        while stream.read(CHUNK_BYTES):
            pass


def test_a_chunk_of_another_file_does_not_open(job, media):
    one, two = store(job, multi_chunk(), "one"), store(job, multi_chunk(), "two")
    other = (media / two.file.name).read_bytes()
    _rewrite(media, one, lambda b: b[: HEADER.size] + other[HEADER.size :])
    with pytest.raises(OutputUnreadable):
        artifacts.output_open(one).read()


def test_an_altered_header_is_refused_before_anything_is_sent(api, member, job, media):
    output = store(job, b"secret weights")
    # the chunk size in the header changed: the first chunk no longer opens
    _rewrite(media, output, lambda b: b[:13] + struct.pack(">I", 4096) + b[17:])
    response = api(member).get(f"/api/v1/jobs/{job.pk}/outputs/model.png")
    assert response.status_code == 409
    assert response.json()["code"] == "output_unreadable"
    assert b"secret weights" not in response.content


def test_an_output_stored_before_encryption_still_downloads(api, member, job):
    path = default_storage.save(f"outputs/{job.pk}/1/legacy", io.BytesIO(b"plain old bytes"))
    JobOutput.objects.create(
        job=job, attempt=1, name="old.txt", size=15, sha256="0" * 64, file=path
    )
    response = api(member).get(f"/api/v1/jobs/{job.pk}/outputs/old.txt")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"plain old bytes"


def test_rotation_rewraps_the_data_keys_and_leaves_the_files(settings, job, media, capsys):
    data = multi_chunk()
    output = store(job, data)
    before = (media / output.file.name).read_bytes()
    old_ring = dict(settings.ENCRYPTION_KEYS)
    settings.ENCRYPTION_KEYS = {"next": encryption.new_key(), **old_ring}
    call_command("reencrypt_secrets")
    assert "1 data keys re-wrapped under key 'next'" in capsys.readouterr().out
    key = TenantDataKey.objects.get(pk=output.data_key_id)
    assert key.key_id == "next" and key.rewrapped_at is not None
    with override_settings(ENCRYPTION_KEYS={"next": settings.ENCRYPTION_KEYS["next"]}):
        # the old key gone: the output still opens, its file untouched
        assert (media / output.file.name).read_bytes() == before
        with artifacts.output_open(JobOutput.objects.get(pk=output.pk)) as stream:
            assert stream.read() == data
        call_command("reencrypt_secrets")  # nothing left to re-wrap
    assert "0 data keys re-wrapped" in capsys.readouterr().out


def test_a_data_key_whose_ring_key_is_gone_is_refused_by_name(api, member, job):
    store(job, b"x" * 10)
    with override_settings(ENCRYPTION_KEYS={"other": encryption.new_key()}):
        response = api(member).get(f"/api/v1/jobs/{job.pk}/outputs/model.png")
    assert response.status_code == 409 and response.json()["code"] == "output_unreadable"


def test_a_multi_chunk_checkpoint_restores_through_the_decrypting_download(
    agent, enroll, tenant, media
):
    """The agent's restore (worker_agent/checkpoint.py) reads the checkpoint through
    GET /api/v1/agent/jobs/{id}/checkpoint: the plaintext tar, its sha256 the assignment's."""
    from tests.jobs.test_agent_checkpoint import checkpointed_on_a_draining_node

    state = os.urandom(3 * CHUNK_BYTES + 123)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo("checkpoint/state")
        entry.size = len(state)
        tar.addfile(entry, io.BytesIO(state))
    archive = buffer.getvalue()
    node_api = bearer_client(agent.secret)
    job = checkpointed_on_a_draining_node(agent, node_api, tenant, archive)
    sealed = (media / job.outputs.get(name="checkpoint.tar").file.name).read_bytes()
    assert state[:4096] not in sealed and archive[:512] not in sealed
    second = enroll(agent.node.pool)  # the drained node takes no work: the next attempt's node
    node_services.node_heartbeat(node=second.node, actor=Actor.for_node(second.node))
    second_api = bearer_client(second.secret)
    place(job)
    [entry] = second_api.get("/api/v1/agent/assignments").json()
    response = second_api.get(f"/api/v1/agent/jobs/{job.pk}/checkpoint")
    assert response.status_code == 200
    assert response["Content-Length"] == str(len(archive))
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == entry["restore"]["sha256"]
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.extractfile("checkpoint/state").read() == state


def test_data_keys_are_made_once_under_concurrent_first_need(tenant):
    first = data_key_for(tenant.pk)
    assert data_key_for(tenant.pk).pk == first.pk
    assert TenantDataKey.objects.filter(tenant=tenant, active=True).count() == 1


def test_no_key_material_in_the_outputs_listing(api, member, job):
    store(job, b"abc")
    listing = api(member).get(f"/api/v1/jobs/{job.pk}/outputs").json()
    assert set(listing[0]) >= {"name", "size", "sha256"}
    assert not {"data_key", "wrapped", "key_id"} & set(listing[0])


def test_without_a_key_ring_an_upload_is_refused_and_nothing_is_stored(agent, tenant, media):
    from tests.jobs.test_agent_api import run
    from tests.jobs.test_agent_checkpoint import upload

    node_api = bearer_client(agent.secret)
    job, lease = place(submit_job(agent.node.pool, tenant))
    run(node_api, job, lease)
    with override_settings(ENCRYPTION_KEYS={}):
        response = upload(node_api, job, lease, "result.txt", b"not to be kept in plaintext")
    assert response.status_code == 503 and response.json()["code"] == "encryption_unavailable"
    assert not job.outputs.exists()
    assert not [p for p in media.rglob("*") if p.is_file()]
