"""Issue 17: a job sees only the secrets it was given, and neither the node's operator nor the
database holds them in clear.

- At rest: each value is AES-256-GCM ciphertext under a key id of ENCRYPTION_KEYS, bound to its
  tenant and name; `manage.py reencrypt_secrets` moves every value to the current key, after
  which the old key can go; a key that is gone is a clear error, never a fallback.
- In logs: the value and its base64, hex and URL-encoded forms are masked, also when the
  agent's chunking splits one in two. The job prints them on the real engine.
"""

import base64
import urllib.parse

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from config.builders import build_secret
from jobs import artifacts
from pools import encryption
from pools.models import TenantSecret
from tests.clients import bearer_client

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


def test_a_value_split_across_two_chunks_is_masked_when_the_log_is_read(agent, tenant, member, api):
    build_secret(tenant, "db-pass", VALUE)
    job = placed(agent.node.pool, tenant, ["true"], secrets={"DB_PASS": "db-pass"})
    half = len(VALUE) // 2
    artifacts.job_log_append(job=job, attempt=1, text=f"pass={VALUE[:half]}")
    artifacts.job_log_append(job=job, attempt=1, text=f"{VALUE[half:]}\n")
    log = api(member).get(f"/api/v1/jobs/{job.pk}/logs").content.decode()
    assert log == "pass=[secret db-pass]\n"
