"""Issue #17: viewing logs and retrieving outputs are token scopes of their own (`logs:read`,
`outputs:read`) beside `read`; a token made before the split keeps both (pools migration
0011); a token refused for a scope is told which one."""

import importlib

import pytest
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile

from config.builders import submit_job
from jobs import artifacts
from pools.models import ApiToken
from pools.services import api_token_issue
from tests.clients import bearer_client

split = importlib.import_module("pools.migrations.0011_split_read_scope_shape_admin")
LOG_LINE = "epoch 3: loss 0.25\n"


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")


@pytest.fixture
def job(pool, tenant):
    job = submit_job(pool, tenant)
    artifacts.job_log_append(job=job, attempt=1, text=LOG_LINE)
    upload = SimpleUploadedFile("result.txt", b"42\n")
    artifacts.job_output_store(job=job, attempt=1, name="result.txt", fileobj=upload)
    return job


def reads(secret, job) -> dict:
    """What each data read of the job answers with this token."""
    client = bearer_client(secret)
    base = f"/api/v1/jobs/{job.pk}"
    return {
        "logs": client.get(f"{base}/logs"),
        "outputs": client.get(f"{base}/outputs"),
        "file": client.get(f"{base}/outputs/result.txt"),
        "job": client.get(f"{base}"),
    }


def test_a_read_token_of_before_the_split_keeps_reading_logs_and_outputs(member, job):
    token, secret = api_token_issue(user=member, name="old ci", scopes=["read"])
    refused = reads(secret, job)  # what a read token gets once read no longer covers them
    assert [refused[k].status_code for k in ("logs", "outputs", "file")] == [403, 403, 403]

    split.split_read_scope(apps, None)  # the data migration, on today's models

    token.refresh_from_db()
    assert token.scopes == ["logs:read", "outputs:read", "read"]
    answers = reads(secret, job)
    assert {k: r.status_code for k, r in answers.items()} == dict.fromkeys(answers, 200)
    assert answers["logs"].content.decode() == LOG_LINE
    assert b"".join(answers["file"].streaming_content) == b"42\n"


def test_the_migration_leaves_tokens_without_read_alone(member):
    token, _ = api_token_issue(user=member, name="writer", scopes=["write"])
    split.split_read_scope(apps, None)
    token.refresh_from_db()
    assert token.scopes == ["write"]


@pytest.mark.parametrize(
    ("scopes", "refused", "missing"),
    [
        (["read", "outputs:read"], ("logs",), "logs:read"),
        (["read", "logs:read"], ("outputs", "file"), "outputs:read"),
    ],
)
def test_a_new_token_without_the_scope_is_refused_naming_it(member, job, scopes, refused, missing):
    _, secret = api_token_issue(user=member, name="narrow", scopes=scopes)
    for name, response in reads(secret, job).items():
        if name not in refused:
            assert response.status_code == 200, name
            continue
        body = response.json()
        assert response.status_code == 403 and body["code"] == "scope_missing", name
        assert missing in body["message"], body
        assert LOG_LINE not in response.content.decode()


def test_a_read_only_token_writing_is_told_which_scope_it_lacks(member, cpu_shape):
    _, secret = api_token_issue(user=member, name="ro", scopes=["read"])
    body = {"tenant": "vision", "pool": "test", "shape": cpu_shape.name, "image": "x"}
    response = bearer_client(secret).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "scope_missing"
    assert "write scope" in response.json()["message"]
    assert "Authentication as a person" not in response.json()["message"]  # the old answer


def test_new_tokens_name_the_split_scopes(member):
    client = bearer_client(api_token_issue(user=member, name="full")[1])
    narrow = client.post("/api/v1/tokens/", {"name": "logs", "scopes": ["logs:read"]})
    assert narrow.status_code == 201 and narrow.json()["scopes"] == ["logs:read"]
    default = client.post("/api/v1/tokens/", {"name": "default"})
    assert default.status_code == 201
    assert default.json()["scopes"] == ["logs:read", "outputs:read", "read", "write"]
    # a token minted with a token that lacks a scope cannot grant it
    logs_only = bearer_client(narrow.json()["secret"])
    wider = logs_only.post("/api/v1/tokens/", {"name": "x", "scopes": ["outputs:read"]})
    assert wider.status_code == 403  # minting is a write: the logs:read token may not
    assert not ApiToken.objects.filter(name="x").exists()


def test_the_console_offers_the_split_scopes(client, member):
    client.force_login(member)
    page = client.get("/console/tokens").content.decode()
    assert 'value="logs:read"' in page and 'value="outputs:read"' in page
    made = client.post(
        "/console/tokens", {"name": "only logs", "scopes": ["logs:read"], "ttl_days": 7}
    )
    assert made.status_code == 200
    assert ApiToken.objects.get(user=member, name="only logs").scopes == ["logs:read"]
