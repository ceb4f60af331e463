"""A job's logs and outputs: appended and stored by the services the agent API calls, tailed,
listed and downloaded by the job's tenant through the API (others get 404)."""

import hashlib
import io

import pytest
from django.core.exceptions import ValidationError
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import SimpleUploadedFile, TemporaryUploadedFile

from config.builders import build_secret, submit_job
from jobs import artifacts
from jobs.models import JobLogChunk, JobOutput


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def job(pool, tenant):
    return submit_job(pool, tenant)


def test_tail_returns_the_last_lines_across_chunks(api, member, job):
    artifacts.job_log_append(job=job, attempt=1, text="one\ntwo\nthr")
    artifacts.job_log_append(job=job, attempt=1, text="ee\nfour\n")
    assert artifacts.job_log_tail(job, 2) == "three\nfour\n"
    response = api(member).get(f"/api/v1/jobs/{job.pk}/logs?tail=3")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode() == "two\nthree\nfour\n"
    whole = api(member).get(f"/api/v1/jobs/{job.pk}/logs")  # default: the last 1000 lines
    assert whole.content.decode() == "one\ntwo\nthree\nfour\n"


@pytest.mark.parametrize("tail", ["0", "10001", "x", "-1"])
def test_tail_out_of_range_is_a_400(api, member, job, tail):
    response = api(member).get(f"/api/v1/jobs/{job.pk}/logs?tail={tail}")
    assert response.status_code == 400
    assert "tail" in response.json()


def test_log_keeps_the_newest_10_mib(job):
    line = "x" * 1023 + "\n"
    chunk = line * 256  # 256 KiB, the largest chunk
    for n in range(44):  # 11 MiB
        artifacts.job_log_append(job=job, attempt=1, text=chunk.replace("x", str(n % 10), 1))
    kept = list(job.log_chunks.order_by("seq").values_list("seq", "text"))
    assert sum(len(text) for _, text in kept) <= artifacts.LOG_KEEP_BYTES
    assert kept[-1][0] == 44 and kept[0][0] > 1  # the oldest went, the newest stayed
    assert len(kept) == 40
    assert artifacts.job_log_tail(job, 1) == line
    assert artifacts.job_log_tail(job, 256).startswith("3" + "x" * 1022)  # the newest chunk


def test_oversized_chunks_are_refused_and_nul_is_stored_safely(job):
    with pytest.raises(ValidationError):
        artifacts.job_log_append(job=job, attempt=1, text="x" * (256 * 1024 + 1))
    artifacts.job_log_append(job=job, attempt=1, text="a\x00b\n")
    assert artifacts.job_log_tail(job, 1) == "a\ufffdb\n"


def test_secret_values_printed_by_the_job_are_masked(pool, tenant):
    build_secret(tenant, "hf-token", "hf_do_not_show_me")
    job = submit_job(pool, tenant, secrets={"HF_TOKEN": "hf-token"})
    artifacts.job_log_append(job=job, attempt=1, text="token=hf_do_not_show_me\n")
    assert artifacts.job_log_tail(job, 10) == "token=[secret hf-token]\n"


def test_outputs_are_stored_listed_and_downloaded(api, member, job, media):
    content = b"hello\n"
    stored = artifacts.job_output_store(
        job=job, attempt=1, name="greeting.txt", fileobj=io.BytesIO(content)
    )
    assert stored.size == 6 and stored.sha256 == hashlib.sha256(content).hexdigest()
    # under a key of its own below the attempt's folder; the name is the row's
    assert stored.file.name.startswith(f"outputs/{job.pk}/1/")
    assert "greeting" not in stored.file.name
    sealed = (media / stored.file.name).read_bytes()  # ciphertext at rest (tests/storage/)
    assert content not in sealed and artifacts.output_open(stored).read() == content
    client = api(member)
    listing = client.get(f"/api/v1/jobs/{job.pk}/outputs").json()
    assert [(o["name"], o["size"], o["sha256"]) for o in listing] == [
        ("greeting.txt", 6, stored.sha256)
    ]
    response = client.get(f"/api/v1/jobs/{job.pk}/outputs/greeting.txt")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == content
    assert response["Content-Disposition"] == 'attachment; filename="greeting.txt"'
    assert client.get(f"/api/v1/jobs/{job.pk}/outputs/missing.txt").status_code == 404


def test_a_large_upload_from_a_temporary_file_is_hashed_completely(job):
    upload = TemporaryUploadedFile("big.bin", "application/octet-stream", 0, None)
    data = bytes(range(256)) * 20_000  # 5 MB, past Django's in-memory threshold
    upload.write(data)
    upload.seek(0)
    stored = artifacts.job_output_store(job=job, attempt=1, name="big.bin", fileobj=upload)
    assert stored.size == len(data) and stored.sha256 == hashlib.sha256(data).hexdigest()
    with artifacts.output_open(stored) as handle:  # stored sealed, read back in plaintext
        assert handle.read() == data


def test_the_same_name_replaces_and_the_newest_attempt_is_listed(
    api, member, job, django_capture_on_commit_callbacks
):
    first = artifacts.job_output_store(job=job, attempt=1, name="a.txt", fileobj=io.BytesIO(b"1"))
    old_path = first.file.name
    with django_capture_on_commit_callbacks(execute=True):  # the old file goes on commit
        again = artifacts.job_output_store(
            job=job, attempt=1, name="a.txt", fileobj=io.BytesIO(b"2")
        )
    assert JobOutput.objects.filter(job=job).count() == 1
    assert not default_storage.exists(old_path) and artifacts.output_open(again).read() == b"2"
    artifacts.job_output_store(job=job, attempt=2, name="b.txt", fileobj=io.BytesIO(b"3"))
    listing = api(member).get(f"/api/v1/jobs/{job.pk}/outputs").json()
    assert [(o["name"], o["attempt"]) for o in listing] == [("b.txt", 2)]
    assert api(member).get(f"/api/v1/jobs/{job.pk}/outputs/a.txt").status_code == 404


@pytest.mark.parametrize(
    "name", ["../escape.txt", "a/b.txt", "..", "a\\b", "nul\x00.txt", "", "x" * 256, "a..b"]
)
def test_names_that_could_leave_the_folder_are_refused(job, media, name):
    with pytest.raises(ValidationError):
        artifacts.job_output_store(job=job, attempt=1, name=name, fileobj=io.BytesIO(b"x"))
    assert not JobOutput.objects.exists()
    assert not [path for path in media.parent.rglob("*") if path.is_file()]


def test_an_upload_over_the_limit_leaves_no_file(settings, job, media):
    settings.JOB_OUTPUT_MAX_BYTES = 10
    upload = SimpleUploadedFile("big.txt", b"x" * 11)
    with pytest.raises(ValidationError):
        artifacts.job_output_store(job=job, attempt=1, name="big.txt", fileobj=upload)
    assert not JobOutput.objects.exists()
    assert not list((media / "outputs").rglob("big*"))


def test_other_tenants_get_404_for_logs_and_outputs(api, outsider, job):
    artifacts.job_log_append(job=job, attempt=1, text="secret plans\n")
    artifacts.job_output_store(job=job, attempt=1, name="o.txt", fileobj=io.BytesIO(b"x"))
    client = api(outsider)
    for path in ("logs", "outputs", "outputs/o.txt"):
        assert client.get(f"/api/v1/jobs/{job.pk}/{path}").status_code == 404, path
    assert JobLogChunk.objects.count() == 1
