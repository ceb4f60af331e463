"""The local S3-compatible server the object-store tests talk to over HTTP: moto's standalone
server that .ci/ensure-services.sh starts on 127.0.0.1:9000 (OBJECT_STORE_TEST_URL changes it).
Outside CI a server that does not answer skips the tests with this message; in CI it fails.

moto accepts any credentials and does not check presigned signatures: these tests show the
data path (keys, sizes, digests, what reaches whom), not that the store enforces a signature.
"""

from __future__ import annotations

import os
import uuid

import boto3
import pytest
import requests
from botocore.config import Config
from django.test import override_settings

from config.builders import build_person, build_token
from pools.actors import Actor
from pools.choices import TenantRole
from pools.services import bucket_register
from tests.conftest import require_service

STORE = os.environ.get("OBJECT_STORE_TEST_URL", "http://127.0.0.1:9000").rstrip("/")
REGION = "us-east-1"
# a tenant's credentials, made up per run: the tests grep for them everywhere
ACCESS_KEY_ID = "AKIA" + uuid.uuid4().hex[:16].upper()
SECRET_ACCESS_KEY = "sk-" + uuid.uuid4().hex + uuid.uuid4().hex[:8]


def require_store() -> None:
    try:
        up = requests.get(f"{STORE}/moto-api/data.json", timeout=2).ok
    except requests.RequestException:
        up = False
    require_service(up, f"the S3-compatible test server at {STORE} (run .ci/ensure-services.sh)")


def s3_client():
    """The tenant's own view of its store (boto3 over HTTP, like any S3 client)."""
    return boto3.client(
        "s3",
        endpoint_url=STORE,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def new_bucket(prefix: str = "cp") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    s3_client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3():
    require_store()
    return s3_client()


def registered_bucket(stack, django_db_blocker, prefix: str):
    """A new bucket of the e2e stack's tenant, registered over HTTP by a tenant admin, with
    the store's endpoint registered in OBJECT_STORE_ENDPOINTS while it is in use (a generator:
    a module fixture yields from it)."""
    require_store()
    settings = override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
    settings.enable()
    try:
        name = new_bucket(prefix)
        with django_db_blocker.unblock():
            admin = build_person(f"{prefix}-s3-admin", tenant=stack.tenant, role=TenantRole.ADMIN)
            token = build_token(admin)
        answer = requests.post(
            f"{stack.url}/api/v1/buckets",
            json={
                "tenant": stack.tenant.slug,
                "bucket": name,
                "endpoint": STORE,
                "region": REGION,
                "access_key_id": ACCESS_KEY_ID,
                "secret_access_key": SECRET_ACCESS_KEY,
            },
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        yield name
    finally:
        settings.disable()


def register_bucket(tenant, prefix: str) -> str:
    """A new bucket of `tenant`, registered through the service (its HEAD against the store)."""
    name = new_bucket(prefix)
    with override_settings(OBJECT_STORE_ENDPOINTS=[STORE]):
        bucket_register(
            tenant=tenant,
            bucket=name,
            endpoint=STORE,
            region=REGION,
            access_key_id=ACCESS_KEY_ID,
            secret_access_key=SECRET_ACCESS_KEY,
            actor=Actor.system("tests"),
        )
    return name
