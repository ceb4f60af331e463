"""Tenants' buckets on S3-compatible stores, spoken to over HTTP with boto3 (docs/storage.md,
"Object stores: buckets, inputs and outputs").

The control plane alone holds a bucket's credentials (sealed in `TenantBucket`); what leaves it
are presigned URLs, each scoped to one object, one method and a bounded lifetime:
- an input: a GET of that key, for the lease's remaining lifetime (at most PRESIGN_MAX_S);
- an output: a PUT of one key whose Content-Length, `x-amz-meta-sha256` (and the server-side
  encryption header, where the bucket asks for it) are signed in, so the agent can only send
  exactly the file it announced, under the name the control plane chose.

Requests go path-style (`<endpoint>/<bucket>/<key>`), so every URL is on the registered
endpoint's origin (the agent reaches only `OBJECT_STORE_ENDPOINTS` origins). Errors of the store
are `StoreError` with a field and a message for a person; a credential never appears in one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

PRESIGN_MIN_S = 60
PRESIGN_MAX_S = 7 * 86400  # SigV4's own limit
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html (and dots)
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
KEY_MAX_BYTES = 1024
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
TIMEOUT_S = 10


class StoreError(Exception):
    """The store refused or did not answer; `field` is the request field it is about."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def origin(url: str) -> str:
    """scheme://host:port, lower case, the port explicit (the agent's form as well)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}".lower()


def registered_endpoint(endpoint: str) -> bool:
    """Whether `endpoint` is on an origin of OBJECT_STORE_ENDPOINTS."""
    if not isinstance(endpoint, str) or urlsplit(endpoint).scheme not in ("http", "https"):
        return False
    return origin(endpoint) in {origin(e) for e in settings.OBJECT_STORE_ENDPOINTS}


def parse_url(url: str) -> tuple[str, str]:
    """("bucket", "key") of `s3://bucket/key` (the key may be "" or end with "/"); ValueError
    when it is not one."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ValueError("An s3://bucket/key URL.")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"{bucket[:70]!r} is not a bucket name (3-63 a-z, 0-9, '.', '-').")
    if len(key.encode()) > KEY_MAX_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(f"The key has at most {KEY_MAX_BYTES} bytes, no control characters.")
    if any(part in (".", "..") for part in key.split("/")):
        raise ValueError("The key has no '.' or '..' segment.")
    return bucket, key


@dataclass(frozen=True)
class Target:
    """Where to reach one bucket, and as whom (never logged, never returned)."""

    endpoint: str
    region: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    server_side_encryption: str = ""

    @classmethod
    def of(cls, row) -> Target:
        """The Target of a `pools.models.TenantBucket` (its credentials decrypted)."""
        key_id, secret = row.reveal()
        return cls(row.endpoint, row.region, row.bucket, key_id, secret, row.server_side_encryption)

    def __repr__(self):  # never the credentials
        return f"Target({self.endpoint!r}, {self.bucket!r})"

    def client(self):
        return _client(self)


@functools.lru_cache(maxsize=128)
def _client(target: Target):
    """One boto3 client per bucket and credentials, per process (making one costs
    milliseconds; a client is thread-safe)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=target.endpoint,
        region_name=target.region,
        aws_access_key_id=target.access_key_id,
        aws_secret_access_key=target.secret_access_key,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            connect_timeout=TIMEOUT_S,
            read_timeout=TIMEOUT_S,
            retries={"max_attempts": 2, "mode": "standard"},
        ),
    )


def _bounded(expires_s: float) -> int:
    return int(min(PRESIGN_MAX_S, max(PRESIGN_MIN_S, expires_s)))


def check_bucket(target: Target) -> None:
    """A HEAD of the bucket with its credentials; StoreError naming the field to fix."""
    try:
        target.client().head_bucket(Bucket=target.bucket)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if status == 404 or code in ("404", "NoSuchBucket"):
            raise StoreError("bucket", f"The store has no bucket {target.bucket!r}.") from None
        if status in (401, 403) or code in ("403", "AccessDenied", "InvalidAccessKeyId"):
            raise StoreError(
                "secret_access_key",
                "The store refused these credentials for this bucket (HEAD bucket: "
                f"{status or code}).",
            ) from None
        if status == 301 or code in ("301", "PermanentRedirect", "AuthorizationHeaderMalformed"):
            raise StoreError("region", "The bucket is in another region.") from None
        raise StoreError(
            "endpoint", f"The store answered HEAD bucket with {status or code}."
        ) from None
    except (BotoCoreError, OSError) as exc:
        raise StoreError(
            "endpoint", f"The store at {target.endpoint} does not answer: {type(exc).__name__}."
        ) from None


def presign_get(target: Target, key: str, expires_s: float) -> str:
    """A GET of exactly `key`, valid `expires_s` (bounded to PRESIGN_MIN_S … PRESIGN_MAX_S)."""
    return target.client().generate_presigned_url(
        "get_object",
        Params={"Bucket": target.bucket, "Key": key},
        ExpiresIn=_bounded(expires_s),
    )


def presign_put(target: Target, key: str, *, size: int, sha256: str, expires_s: float) -> dict:
    """{"url", "headers"}: a PUT of exactly `size` bytes to `key`, with the file's sha256 as
    object metadata and server-side encryption where the bucket asks for it. Every header in
    `headers` is signed in: the PUT must send each, as given."""
    params = {
        "Bucket": target.bucket,
        "Key": key,
        "ContentLength": size,
        "Metadata": {"sha256": sha256},
    }
    headers = {"Content-Length": str(size), "x-amz-meta-sha256": sha256}
    if target.server_side_encryption:
        params["ServerSideEncryption"] = target.server_side_encryption
        headers["x-amz-server-side-encryption"] = target.server_side_encryption
    url = target.client().generate_presigned_url(
        "put_object", Params=params, ExpiresIn=_bounded(expires_s)
    )
    return {"url": url, "headers": headers}


@dataclass(frozen=True)
class Head:
    size: int
    sha256: str  # the object's x-amz-meta-sha256 ("" when it has none)
    server_side_encryption: str


def head(target: Target, key: str) -> Head | None:
    """What the store holds at `key` (None: nothing); StoreError when it cannot say."""
    try:
        answer = target.client().head_object(Bucket=target.bucket, Key=key)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            return None
        raise StoreError("name", f"The store answered HEAD with {status}.") from None
    except (BotoCoreError, OSError) as exc:
        raise StoreError("name", f"The store does not answer: {type(exc).__name__}.") from None
    metadata = {k.lower(): v for k, v in (answer.get("Metadata") or {}).items()}
    return Head(
        size=int(answer.get("ContentLength", -1)),
        sha256=str(metadata.get("sha256", "")),
        server_side_encryption=str(answer.get("ServerSideEncryption") or ""),
    )


def delete(target: Target, key: str) -> None:
    """Removes an object the control plane refused (best effort: StoreError when it cannot)."""
    try:
        target.client().delete_object(Bucket=target.bucket, Key=key)
    except (ClientError, BotoCoreError, OSError) as exc:
        raise StoreError("name", f"The store did not delete it: {type(exc).__name__}.") from None
