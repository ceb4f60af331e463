"""A job's inputs from, and outputs to, its tenant's registered buckets (docs/storage.md,
"Object stores: buckets, inputs and outputs"); the presigning itself is pools/objectstore.py.

- At submit: every `s3://` input and an `s3://` output destination name a bucket the job's
  tenant registered (`submit_errors`, a 400 on the field otherwise).
- In an assignment: each `s3://` input becomes a presigned GET of that one key, valid for the
  lease's remaining lifetime (`input_presigner`); a job whose bucket is gone or whose
  credentials no longer decrypt fails `input_unavailable` instead (`inputs_unavailable`). The
  output destination is told as `output_store` — where, never how to sign.
- Outputs: the agent asks for a presigned PUT per file (`output_presign`: name, size, sha256;
  key `<prefix><job>/<attempt>/<name>`), PUTs it, then asks the control plane to record it
  (`output_record`): a HEAD must show the announced size and sha256 (object metadata), else
  the object is deleted and the output refused (409 `output_mismatch`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from pools import objectstore, validation
from pools.actors import Actor
from pools.encryption import EncryptionError
from pools.models import TenantBucket
from pools.reasons import Reason
from pools.statemachine import Refusal, TransitionRefused

from .models import Job, JobOutput
from .services import job_finish

OUTPUT_PUT_EXPIRES_S = 15 * 60  # a presigned PUT is used at once, right after it is issued
OUTPUT_MAX_BYTES = 5 * 1024**3  # one PUT (S3's limit for a single-part upload)


def _s3_inputs(inputs) -> list[dict]:
    return [item for item in inputs or () if str(item.get("url", "")).startswith("s3://")]


def submit_errors(tenant, inputs: list[dict], destination: str) -> dict:
    """{field: errors} for s3:// inputs and an output destination naming a bucket `tenant`
    has not registered (the same answer whether or not someone else registered it)."""
    wanted = {objectstore.parse_url(item["url"])[0] for item in _s3_inputs(inputs)}
    if destination.startswith("s3://"):
        wanted.add(objectstore.parse_url(destination)[0])
    if not wanted:
        return {}
    known = set(
        TenantBucket.objects.filter(tenant=tenant, bucket__in=wanted).values_list(
            "bucket", flat=True
        )
    )
    errors: dict = {}
    for index, item in enumerate(inputs or ()):
        if item["url"].startswith("s3://"):
            bucket = objectstore.parse_url(item["url"])[0]
            if bucket not in known:
                errors.setdefault("inputs", {})[str(index)] = {"url": [_unregistered(bucket)]}
    if destination.startswith("s3://"):
        bucket = objectstore.parse_url(destination)[0]
        if bucket not in known:
            errors["output_destination"] = [_unregistered(bucket)]
    return errors


def _unregistered(bucket: str) -> str:
    return (
        f"The tenant has registered no bucket {bucket!r} (POST /api/v1/buckets, by a tenant admin)."
    )


class InputUnavailable(Exception):
    """An s3:// input cannot be presigned: its bucket is gone or its credentials unreadable."""


def _target(tenant_id: int, bucket: str) -> objectstore.Target:
    row = TenantBucket.objects.filter(tenant_id=tenant_id, bucket=bucket).first()
    if row is None:
        raise InputUnavailable(f"the tenant's bucket {bucket!r} is no longer registered")
    if not objectstore.registered_endpoint(row.endpoint):
        raise InputUnavailable(f"bucket {bucket!r}: its endpoint left OBJECT_STORE_ENDPOINTS")
    try:
        return objectstore.Target.of(row)
    except EncryptionError as exc:
        raise InputUnavailable(
            f"bucket {bucket!r}: its credentials do not decrypt: {exc}"
        ) from None


def input_presigner(job: Job, lease, *, strict: bool = False, now=None):
    """url → a presigned GET of that object, valid for the lease's remaining lifetime (at least
    objectstore.PRESIGN_MIN_S, at most PRESIGN_MAX_S); None for an input that cannot be
    presigned (`strict`: raises InputUnavailable instead)."""
    now = now or timezone.now()
    expires_s = (lease.expires_at - now).total_seconds() if lease.expires_at else 0
    targets: dict[str, objectstore.Target] = {}

    def presign(url: str) -> str | None:
        bucket, key = objectstore.parse_url(url)
        try:
            if bucket not in targets:
                targets[bucket] = _target(job.tenant_id, bucket)
        except InputUnavailable:
            if strict:
                raise
            return None
        return objectstore.presign_get(targets[bucket], key, expires_s)

    return presign


def inputs_unavailable(lease) -> bool:
    """Fails (`input_unavailable`, naming the input) a job whose s3:// input cannot be
    presigned; True when it did. One such job never stops the node's other assignments."""
    job = lease.job
    items = _s3_inputs(job.inputs)
    if not items:
        return False
    presign = input_presigner(job, lease, strict=True)
    try:
        for item in items:
            presign(item["url"])
    except InputUnavailable as exc:
        with contextlib.suppress(TransitionRefused):  # ended meanwhile
            job_finish(
                job=job,
                actor=Actor.system("assignments"),
                exit_code=None,
                reason=Reason.INPUT_UNAVAILABLE,
                message=f"input {item['name']}: {exc}"[:1000],
            )
        return True
    return False


def assignment_output(job: Job) -> dict | None:
    """The assignment's `output_store`: where the outputs go (no credential)."""
    if not job.output_destination.startswith("s3://"):
        return None
    return {"kind": "s3", "location": job.output_destination}


# --- outputs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    target: objectstore.Target
    prefix: str

    def key(self, job: Job, attempt: int, name: str) -> str:
        return f"{self.prefix}{job.pk}/{attempt}/{name}"

    def location(self, key: str) -> str:
        return f"s3://{self.target.bucket}/{key}"


def _destination(job: Job) -> Destination:
    if not job.output_destination.startswith("s3://"):
        raise Refusal(
            'This job\'s outputs go to the control plane (output_destination ""): upload '
            "them to /agent/jobs/{id}/outputs.",
            code=Reason.OUTPUT_PATH_MISMATCH,
        )
    bucket, prefix = objectstore.parse_url(job.output_destination)
    try:
        return Destination(_target(job.tenant_id, bucket), prefix)
    except InputUnavailable as exc:
        raise Refusal(
            f"The output destination cannot be used: {exc}.", code=Reason.BUCKET_UNAVAILABLE
        ) from None


def _checked(name: str, size: int, sha256: str) -> None:
    validation.file_name(name)
    if not objectstore.SHA256_HEX.fullmatch(sha256 or ""):
        raise ValidationError({"sha256": "64 lower-case hex digits."})
    if not 0 <= size <= OUTPUT_MAX_BYTES:
        raise ValidationError({"size": f"0 … {OUTPUT_MAX_BYTES} bytes."})


def output_presign(*, job: Job, attempt: int, name: str, size: int, sha256: str) -> dict:
    """{"url", "headers", "location"}: a presigned PUT of exactly this file to
    `<prefix><job>/<attempt>/<name>` in the job's destination bucket."""
    _checked(name, size, sha256)
    destination = _destination(job)
    key = destination.key(job, attempt, name)
    signed = objectstore.presign_put(
        destination.target, key, size=size, sha256=sha256, expires_s=OUTPUT_PUT_EXPIRES_S
    )
    return signed | {"location": destination.location(key)}


def output_record(*, job: Job, attempt: int, name: str, size: int, sha256: str) -> JobOutput:
    """Records an output the agent PUT: a HEAD must show `size` and `sha256` (its metadata),
    else the object is removed and the output refused (409 `output_mismatch`). Replaces the
    row of the same name and attempt (a retried upload)."""
    _checked(name, size, sha256)
    destination = _destination(job)
    key = destination.key(job, attempt, name)
    try:
        found = objectstore.head(destination.target, key)
    except objectstore.StoreError as error:
        raise Refusal(
            f"The store cannot say what it holds: {error.message}", code=Reason.OBJECT_STORE_ERROR
        ) from None
    problem = None
    if found is None:
        problem = "the store holds no object under its key"
    elif found.size != size:
        problem = f"the store holds {found.size} bytes, not the {size} announced"
    elif found.sha256 != sha256:
        problem = "its sha256 metadata is not the digest announced"
    if problem:
        if found is not None:
            with contextlib.suppress(objectstore.StoreError):
                objectstore.delete(destination.target, key)
        raise Refusal(f"Output {name!r} refused: {problem}.", code=Reason.OUTPUT_MISMATCH)
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).values("pk").first()
        JobOutput.objects.filter(job=job, attempt=attempt, name=name).delete()
        return JobOutput.objects.create(
            job=job,
            attempt=attempt,
            name=name,
            size=size,
            sha256=sha256,
            file="",
            location=destination.location(key),
        )
