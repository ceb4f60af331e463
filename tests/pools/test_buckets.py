"""/api/v1/buckets: a tenant's registered buckets, against the local S3 server over HTTP
(tests/storage/s3server.py). Credentials are write-only, checked by a real HEAD of the bucket,
stored sealed; members list, admins register and remove; other tenants and operators see none."""

import json

import pytest
from django.test import override_settings

from config.builders import build_person, build_tenant
from pools.choices import PlatformRole, TenantRole
from pools.models import TenantBucket, TenantBucketEvent
from tests.storage.s3server import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    STORE,
    new_bucket,
    s3,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("s3")]


def body(tenant, bucket, **extra):
    return {
        "tenant": tenant.slug,
        "bucket": bucket,
        "endpoint": STORE,
        "access_key_id": ACCESS_KEY_ID,
        "secret_access_key": SECRET_ACCESS_KEY,
    } | extra


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_an_admin_registers_a_bucket_its_members_list_it_and_no_answer_holds_the_credentials(
    api, tenant, tenant_admin, member
):
    bucket = new_bucket()
    created = api(tenant_admin).post("/api/v1/buckets", body(tenant, bucket), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["location"] == f"s3://{bucket}/"
    assert created.json()["server_side_encryption"] == "AES256"
    listed = api(member).get("/api/v1/buckets")
    assert [row["bucket"] for row in listed.json()] == [bucket]
    one = api(member).get(f"/api/v1/buckets/{created.json()['id']}")
    events = api(tenant_admin).get("/api/v1/buckets/events")
    assert [e["reason"] for e in events.json()] == ["bucket_registered"]
    for answer in (created, listed, one, events):
        text = answer.content.decode()
        assert ACCESS_KEY_ID not in text and SECRET_ACCESS_KEY not in text
    row = TenantBucket.objects.get(bucket=bucket)
    # sealed at rest: neither value is in the row's bytes, and it opens to both
    assert ACCESS_KEY_ID.encode() not in bytes(row.ciphertext)
    assert SECRET_ACCESS_KEY.encode() not in bytes(row.ciphertext)
    assert row.reveal() == (ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    event = TenantBucketEvent.objects.get(bucket=bucket)
    assert SECRET_ACCESS_KEY not in json.dumps(event.data) + event.message


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_registration_is_refused_with_a_field_error_when_the_store_says_no(
    api, tenant, tenant_admin
):
    missing = api(tenant_admin).post(
        "/api/v1/buckets", body(tenant, "cp-no-such-bucket-here"), format="json"
    )
    assert missing.status_code == 400
    assert "no bucket" in missing.json()["bucket"][0]
    elsewhere = api(tenant_admin).post(
        "/api/v1/buckets", body(tenant, new_bucket(), endpoint="http://127.0.0.1:9"), format="json"
    )
    assert elsewhere.status_code == 400
    assert "OBJECT_STORE_ENDPOINTS" in elsewhere.json()["endpoint"][0]
    bad = api(tenant_admin).post(
        "/api/v1/buckets", body(tenant, "Not_A_Bucket", region="x y"), format="json"
    )
    assert bad.status_code == 400 and {"bucket", "region"} <= set(bad.json())
    unknown = api(tenant_admin).post(
        "/api/v1/buckets", body(tenant, new_bucket(), acl="public"), format="json"
    )
    assert unknown.status_code == 400 and "acl" in unknown.json()
    assert not TenantBucket.objects.exists()


@override_settings(OBJECT_STORE_ENDPOINTS=["http://127.0.0.1:1"])
def test_a_store_that_does_not_answer_is_a_400_on_the_endpoint(api, tenant, tenant_admin):
    answer = api(tenant_admin).post(
        "/api/v1/buckets", body(tenant, "cp-any", endpoint="http://127.0.0.1:1"), format="json"
    )
    assert answer.status_code == 400
    assert "does not answer" in answer.json()["endpoint"][0]


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_who_may_register_list_and_remove(api, tenant, tenant_admin, member):
    bucket = new_bucket()
    other = build_tenant("elsewhere")
    outsider = build_person("outsider-b", tenant=other, role=TenantRole.ADMIN)
    operator = build_person("op-b", platform_role=PlatformRole.OPERATOR)
    assert (
        api(member).post("/api/v1/buckets", body(tenant, bucket), format="json").status_code == 403
    )
    # naming someone else's tenant: the same 400 as a tenant that does not exist
    foreign = api(outsider).post("/api/v1/buckets", body(tenant, bucket), format="json")
    assert foreign.status_code == 400 and "tenant" in foreign.json()
    row = api(tenant_admin).post("/api/v1/buckets", body(tenant, bucket), format="json").json()
    for person in (outsider, operator):
        assert api(person).get("/api/v1/buckets").json() == []
        assert api(person).get(f"/api/v1/buckets/{row['id']}").status_code == 404
        assert api(person).delete(f"/api/v1/buckets/{row['id']}").status_code == 404
    assert api(member).delete(f"/api/v1/buckets/{row['id']}").status_code == 403
    assert api(tenant_admin).delete(f"/api/v1/buckets/{row['id']}").status_code == 204
    assert not TenantBucket.objects.exists()
    reasons = [e["reason"] for e in api(tenant_admin).get("/api/v1/buckets/events").json()]
    assert reasons == ["bucket_removed", "bucket_registered"]  # newest first, kept after removal
    assert api(member).get("/api/v1/buckets/events").status_code == 403


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_jobs_name_only_their_tenants_buckets(api, tenant, tenant_admin, member, pool, cpu_shape):
    bucket = new_bucket()
    api(tenant_admin).post("/api/v1/buckets", body(tenant, bucket), format="json")
    theirs = new_bucket()
    other = build_tenant("owner-of-theirs")
    other_admin = build_person("theirs-admin", tenant=other, role=TenantRole.ADMIN)
    assert (
        api(other_admin).post("/api/v1/buckets", body(other, theirs), format="json").status_code
        == 201
    )
    job = {
        "tenant": tenant.slug,
        "pool": pool.slug,
        "name": "reads",
        "shape": cpu_shape.name,
        "image": "127.0.0.1:5000/computepool/busybox:test",
        "command": ["true"],
    }
    refused = api(member).post(
        "/api/v1/jobs",
        job | {"inputs": [f"s3://{theirs}/w.bin"], "output_destination": f"s3://{theirs}/out"},
        format="json",
    )
    assert refused.status_code == 400, refused.content
    assert "registered no bucket" in refused.json()["inputs"]["0"]["url"][0]
    assert "registered no bucket" in refused.json()["output_destination"][0]
    prefix_only = api(member).post(
        "/api/v1/jobs", job | {"inputs": [f"s3://{bucket}/dir/"]}, format="json"
    )
    assert prefix_only.status_code == 400 and "one object" in str(prefix_only.json()["inputs"])
