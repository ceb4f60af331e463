"""Issue 17: a job sees only the secrets it was given, and neither the node's operator nor the
database holds them in clear.

- In the job: files `/run/secrets/NAME` (mode 0400, owned by the job's user) and `NAME_FILE`
  naming each, from a ramfs the agent unmounts on the host once the container started: the
  values are never in the container's environment or `docker inspect`, never on the node's
  disk, gone with the container. The process runtime gets the same files in its directory.
- At rest: each value is AES-256-GCM ciphertext under a key id of ENCRYPTION_KEYS, bound to its
  tenant and name; `manage.py reencrypt_secrets` moves every value to the current key, after
  which the old key can go; a key that is gone is a clear error, never a fallback.
- In logs: the value and its base64, hex and URL-encoded forms are masked, also when the
  agent's chunking splits one in two. The job prints them on the real engine.
"""

import base64
import json
import os
import urllib.parse
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from config.builders import build_secret, pinned_test_image
from jobs import artifacts
from pools import encryption
from pools.models import TenantSecret
from tests.clients import bearer_client
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.process import ProcessRuntime

from .dataplane import Run, assignment_of, placed

pytestmark = pytest.mark.django_db

VALUE = "s3cr3t?>>x y/ä+z"  # every encoded form of it differs (base64 has + and =)
NEW_KEY = base64.urlsafe_b64encode(b"n" * 32).decode()


def stored_rows():
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM pools_tenantsecret")
        return cursor.fetchall()


def test_the_database_holds_ciphertext_under_a_key_id_never_the_value(api, tenant_admin, tenant):
    response = api(tenant_admin).post(
        f"/api/v1/tenants/{tenant.slug}/secrets", {"name": "db-pass", "value": VALUE}, format="json"
    )
    assert response.status_code == 201, response.content

    [row] = stored_rows()
    assert not any(VALUE.encode() in bytes(c) for c in row if isinstance(c, bytes | memoryview))
    assert not any(VALUE in c for c in row if isinstance(c, str))
    secret = TenantSecret.objects.get()
    assert secret.key_id == "test-1"
    sealed = bytes(secret.ciphertext)
    assert len(sealed) == 12 + len(VALUE.encode()) + 16  # nonce, ciphertext, tag
    # AES-GCM under the configured key, bound to the tenant and the name
    key = AESGCM(base64.urlsafe_b64decode(settings.ENCRYPTION_KEYS["test-1"]))
    aad = f"pools.TenantSecret:{tenant.pk}:db-pass".encode()
    assert key.decrypt(sealed[:12], sealed[12:], aad).decode() == VALUE
    # a fresh nonce each time: the same value never seals the same way twice
    build_secret(tenant, "db-pass", VALUE)
    assert bytes(TenantSecret.objects.get().ciphertext) != sealed


def test_rotation_reencrypts_every_value_and_the_old_key_can_go(
    tenant, other_tenant, agent, capsys
):
    build_secret(tenant, "db-pass", VALUE)
    build_secret(other_tenant, "theirs", "other-value")
    old = settings.ENCRYPTION_KEYS
    with override_settings(ENCRYPTION_KEYS={"test-2": NEW_KEY, **old}):
        call_command("reencrypt_secrets")
        assert "2 tenant secrets re-encrypted under key 'test-2'" in capsys.readouterr().out
        call_command("reencrypt_secrets")  # nothing left to do
        assert "0 tenant secrets" in capsys.readouterr().out
    assert set(TenantSecret.objects.values_list("key_id", flat=True)) == {"test-2"}

    with override_settings(ENCRYPTION_KEYS={"test-2": NEW_KEY}):  # the old key removed
        values = {s.name: s.reveal() for s in TenantSecret.objects.all()}
        assert values == {"db-pass": VALUE, "theirs": "other-value"}
        job = placed(agent.node.pool, tenant, ["true"], secrets={"DB_PASS": "db-pass"})
        assert assignment_of(agent.secret, job)["secrets"] == {"DB_PASS": VALUE}


def test_a_key_that_is_gone_or_wrong_is_a_clear_error_never_a_fallback(tenant):
    build_secret(tenant, "db-pass", VALUE)
    secret = TenantSecret.objects.get()
    with (
        override_settings(ENCRYPTION_KEYS={"test-2": NEW_KEY}),
        pytest.raises(encryption.EncryptionError, match="under key 'test-1', which"),
    ):
        secret.reveal()
    with (
        override_settings(ENCRYPTION_KEYS={"test-1": NEW_KEY}),
        pytest.raises(encryption.EncryptionError, match="does not decrypt under key"),
    ):  # same id, another key
        secret.reveal()
    with (
        override_settings(ENCRYPTION_KEYS={}),
        pytest.raises(encryption.EncryptionError, match="not configured"),
    ):
        build_secret(tenant, "new", VALUE)
    with (
        override_settings(ENCRYPTION_KEYS={"bad id!": NEW_KEY}),
        pytest.raises(encryption.EncryptionError, match="key id"),
    ):
        secret.reveal()
    with (
        override_settings(ENCRYPTION_KEYS={"short": "c2hvcnQ="}),
        pytest.raises(encryption.EncryptionError, match="32 bytes"),
    ):
        build_secret(tenant, "new", VALUE)


def test_a_ciphertext_copied_onto_another_row_does_not_decrypt(tenant, other_tenant):
    build_secret(tenant, "db-pass", VALUE)
    build_secret(other_tenant, "db-pass", "theirs-value")
    mine = TenantSecret.objects.get(tenant=tenant)
    TenantSecret.objects.filter(tenant=other_tenant).update(ciphertext=mine.ciphertext)
    with pytest.raises(encryption.EncryptionError, match="does not decrypt"):
        TenantSecret.objects.get(tenant=other_tenant).reveal()


def encoded_forms(value: str) -> dict[str, str]:
    raw = value.encode()
    return {
        "plain": value,
        "base64": base64.b64encode(raw).decode(),
        "base64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
        "url": urllib.parse.quote(value, safe=""),
        "url+": urllib.parse.quote_plus(value),
    }


@pytest.mark.docker
def test_logs_mask_the_value_and_its_encoded_forms(
    agent, tenant, member, api, docker_client, tmp_path
):
    build_secret(tenant, "db-pass", VALUE)
    forms = encoded_forms(VALUE)
    assert len(set(forms.values())) == len(forms)  # every form differs from the others
    script = "".join(f"echo '{kind}: {form}'; " for kind, form in forms.items())
    job = placed(agent.node.pool, tenant, ["sh", "-c", script], secrets={"DB_PASS": "db-pass"})
    run = Run(docker_client, agent.node, assignment_of(agent.secret, job), tmp_path)
    try:
        run.create()
        printed = run.to_end()
    finally:
        run.remove()
    assert all(form in printed for form in forms.values())  # the job did print them

    token = str(job.leases.get().fencing_token)
    response = bearer_client(agent.secret).post(
        f"/api/v1/agent/jobs/{job.pk}/logs",
        {"fencing_token": token, "text": printed},
        format="json",
    )
    assert response.status_code == 200, response.content

    log = api(member).get(f"/api/v1/jobs/{job.pk}/logs").content.decode()
    assert log.splitlines() == [f"{kind}: [secret db-pass]" for kind in forms]
    stored = "".join(job.log_chunks.values_list("text", flat=True))
    assert not any(form in stored for form in forms.values())


@pytest.mark.parametrize("form", ["plain", "base64", "hex", "url"])
def test_a_form_split_across_two_chunks_is_masked_and_never_stored(
    agent, tenant, member, api, form
):
    build_secret(tenant, "db-pass", VALUE)
    job = placed(agent.node.pool, tenant, ["true"], secrets={"DB_PASS": "db-pass"})
    printed = encoded_forms(VALUE)[form]
    for cut in (1, len(printed) // 2, len(printed) - 2):
        artifacts.job_log_append(job=job, attempt=1, text=f"{form}={printed[:cut]}")
        artifacts.job_log_append(job=job, attempt=1, text=f"{printed[cut:]} ok\n")
    log = api(member).get(f"/api/v1/jobs/{job.pk}/logs").content.decode()
    assert log == f"{form}=[secret db-pass] ok\n" * 3
    chunks = list(job.log_chunks.order_by("seq").values_list("text", flat=True))
    assert "".join(chunks) == log
    assert not any(printed[:4] in chunk or printed[-4:] in chunk for chunk in chunks)


def test_the_split_rule_leaves_other_attempts_and_plain_text_alone(agent, tenant):
    build_secret(tenant, "db-pass", VALUE)
    job = placed(agent.node.pool, tenant, ["true"], secrets={"DB_PASS": "db-pass"})
    artifacts.job_log_append(job=job, attempt=1, text=f"first {VALUE[:5]}")
    artifacts.job_log_append(job=job, attempt=2, text="second\n")  # another attempt
    artifacts.job_log_append(job=job, attempt=2, text="s3cr3t is a word, ")
    artifacts.job_log_append(job=job, attempt=2, text="not the value\n")
    chunks = list(job.log_chunks.order_by("seq").values_list("attempt", "text"))
    assert chunks == [
        (1, f"first {VALUE[:5]}"),
        (2, "second\n"),
        (2, "s3cr3t is a word, "),
        (2, "not the value\n"),
    ]


READS_ITS_SECRET = [
    "sh",
    "-c",
    'echo "file=$(cat /run/secrets/DB_PASS)"; echo "via=$(cat "$DB_PASS_FILE")"; '
    'echo "path=$DB_PASS_FILE"; stat -c "stat=%a %u %g" /run/secrets/DB_PASS; '
    'echo "listed=$(ls /run/secrets | tr "\\n" " ")"; '
    'echo x > /run/secrets/DB_PASS 2>/dev/null || echo "write=refused"; env',
]


def mounts_under(path: Path) -> list[str]:
    """The host's mount table entries at or below `path` (its fstype first)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fields[4] == str(path) or fields[4].startswith(f"{path}/"):
            found.append(f"{fstype} {fields[4]}")
    return found


@pytest.mark.docker
def test_a_job_reads_its_secret_from_a_file_and_the_engine_never_holds_the_value(
    agent, tenant, docker_client, tmp_path
):
    build_secret(tenant, "db-pass", VALUE)
    build_secret(tenant, "not-given", "not-given-value")  # the tenant's, but not this job's
    job = placed(agent.node.pool, tenant, READS_ITS_SECRET, secrets={"DB_PASS": "db-pass"})
    run = Run(docker_client, agent.node, assignment_of(agent.secret, job), tmp_path)
    try:
        container = run.create()
        container.reload()
        # docker inspect: no value anywhere in the container's configuration
        assert VALUE not in json.dumps(container.attrs)
        assert "DB_PASS_FILE=/run/secrets/DB_PASS" in container.attrs["Config"]["Env"]
        [mount] = [m for m in container.attrs["Mounts"] if m["Destination"] == "/run/secrets"]
        assert mount["Type"] == "bind" and mount["RW"] is False
        source = Path(mount["Source"])
        # until the start the values live in a ramfs on the host (RAM only), never on its disk
        assert mounts_under(source) == [f"ramfs {source}"]
        printed = run.to_end()
        container.reload()
        assert VALUE not in json.dumps(container.attrs)
        # started: the host's mount is gone, the container holds the only reference
        assert mounts_under(source) == [] and not source.exists()
    finally:
        run.remove()
    lines = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    assert run.ended.exit_code == 0, printed
    assert lines["file"] == VALUE and lines["via"] == VALUE
    assert lines["path"] == "/run/secrets/DB_PASS"
    assert lines["stat"] == "400 65534 65534"  # mode 0400, owned by the job's user
    assert lines["listed"] == "DB_PASS "  # only what it was given
    assert lines["write"] == "refused"
    assert "DB_PASS" not in lines  # the environment holds the path, never the value
    assert printed.count(VALUE) == 2  # the two cats, nothing in `env`


@pytest.mark.docker
def test_a_job_without_secrets_has_no_secrets_mount(agent, tenant, docker_client, tmp_path):
    build_secret(tenant, "db-pass", VALUE)
    job = placed(agent.node.pool, tenant, ["sh", "-c", "ls /run/secrets || echo none"])
    run = Run(docker_client, agent.node, assignment_of(agent.secret, job), tmp_path)
    try:
        container = run.create()
        assert all(m["Destination"] != "/run/secrets" for m in container.attrs["Mounts"])
        printed = run.to_end()
    finally:
        run.remove()
    assert "No such file or directory" in printed and "none" in printed


def submit(client, tenant, pool, shape, **fields):
    body = {
        "tenant": tenant.slug,
        "pool": pool.slug,
        "name": "train",
        "shape": shape.name,
        "image": pinned_test_image(),
        "command": ["true"],
    }
    return client.post("/api/v1/jobs", body | fields, format="json")


@pytest.mark.parametrize("name", ["../etc", "a/b", ".", "..", "A.B", "1A", "a b", ""])
def test_a_secret_name_that_is_not_a_plain_file_name_is_a_400(
    api, member, tenant, pool, cpu_shape, name
):
    build_secret(tenant, "db-pass", VALUE)
    response = submit(api(member), tenant, pool, cpu_shape, secrets={name: "db-pass"})
    assert response.status_code == 400, response.content
    assert "secrets" in response.json()


def test_env_cannot_set_the_variable_that_names_a_secret_file(api, member, tenant, pool, cpu_shape):
    build_secret(tenant, "db-pass", VALUE)
    response = submit(
        api(member),
        tenant,
        pool,
        cpu_shape,
        env={"DB_PASS_FILE": "/tmp/mine"},
        secrets={"DB_PASS": "db-pass"},
    )
    assert response.status_code == 400, response.content
    assert "DB_PASS_FILE" in str(response.json().get("secrets")), response.json()


def test_the_process_runtime_gets_the_same_files_in_its_own_directory(agent, tenant, tmp_path):
    build_secret(tenant, "db-pass", VALUE)
    job = placed(agent.node.pool, tenant, ["true"], secrets={"DB_PASS": "db-pass"})
    entry = assignment_of(agent.secret, job) | {
        "runtime": "process",
        "command": ["sh", "-c", 'cat "$DB_PASS_FILE"; echo; env'],
    }
    # a pool for the process runtime gives no output limit (it cannot keep one)
    entry["limits"] = entry["limits"] | {"output_limit_mib": 0}
    runtime = ProcessRuntime(work_dir=tmp_path)
    workdir = tmp_path / "attempt"
    (workdir / "outputs").mkdir(parents=True)
    handle = runtime.create(Assignment.parse(entry), workdir)
    secret_file = workdir / "secrets" / "DB_PASS"
    assert secret_file.read_text() == VALUE
    assert secret_file.stat().st_mode & 0o777 == 0o400
    assert (workdir / "secrets").stat().st_mode & 0o777 == 0o700
    runtime.start(handle)
    handle.popen.wait(timeout=10)
    printed = (workdir / "output.log").read_text()
    assert printed.splitlines()[0] == VALUE
    assert f"DB_PASS_FILE={secret_file}" in printed
    assert printed.count(VALUE) == 1  # the cat; the environment holds the path only
    runtime.remove(handle)
    assert not (workdir / "secrets").exists()
    assert os.listdir(workdir)  # the rest of the attempt is the runner's to clean
