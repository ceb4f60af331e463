"""A job's logs and outputs: what the agent uploads, kept for the tenant to tail and download.

Logs are chunks in the database (the newest LOG_KEEP_BYTES per job are kept). Outputs are files
in Django's default storage (MEDIA_ROOT unless configured otherwise) under
outputs/<job>/<attempt>/<a random key> (the name is in the row: jobs.models.output_upload_to),
each with its size and sha256 (of the plaintext), sealed as they stream in under the tenant's
data key (jobs/encryption_at_rest.py) and opened as they stream out (`output_open`). Neither
is a state change: no event is written.

Retention (jobs/retention.py): the tenant's days for the job's pool, else the tenant's days for
every pool, else the pool's `output_retention_days` knob (default 30), after a job ended, a
daily sweep (jobs/tasks.py) deletes its output files through the storage API, their rows and
its log, one job at a time, and records `artifacts_expired` on the job (its state is unchanged).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import urllib.parse
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, Sum, Window
from django.db.models.functions import Length
from django.utils import timezone

from leases.services.quota import check_storage
from pools import validation
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.models import ComputePool, TenantSecret
from pools.reasons import Reason
from pools.sweeps import sweep

from . import retention
from .choices import TERMINAL
from .encryption_at_rest import (
    CHUNK_BYTES,
    DecryptingReader,
    EncryptingReader,
    OutputUnreadable,
    data_key_for,
)
from .events import publish_job_event
from .models import Job, JobEvent, JobLogChunk, JobOutput, output_upload_to

LOG_CHUNK_MAX_BYTES = 256 * 1024
# Counted in characters (what the database measures); the same as bytes for ASCII logs.
LOG_KEEP_BYTES = 10 * 1024 * 1024
LOG_TAIL_MAX_LINES = 10_000
# Shorter secret values are not redacted: "1" would blank out every digit of the log.
REDACT_MIN_CHARS = 4


def job_log_append(*, job: Job, attempt: int, text: str) -> JobLogChunk | None:
    """Appends a chunk of the job's log (at most LOG_CHUNK_MAX_BYTES) and trims the log to its
    newest LOG_KEEP_BYTES. The job's secrets are masked (their values and encoded forms,
    `secret_forms`), so a job that prints its token does not leak it to everyone who may read
    the job, nor keeps it in the database: a form the agent's chunking split between the
    previous chunk of the attempt and this one is moved whole into this one, then masked.
    NUL is stored as U+FFFD (PostgreSQL text cannot hold it); the rest of the chunk is kept."""
    if not isinstance(text, str):
        raise ValidationError({"text": "The log text is a string."})
    if len(text.encode()) > LOG_CHUNK_MAX_BYTES:
        raise ValidationError({"text": f"At most {LOG_CHUNK_MAX_BYTES} bytes per chunk."})
    if not text:
        return None
    text = text.replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL
    forms = secret_forms(job)
    with transaction.atomic():
        # the job's row lock orders concurrent appends: seq is gapless and increasing
        Job.objects.select_for_update().filter(pk=job.pk).values("pk").first()
        last = job.log_chunks.order_by("-seq").first()
        if forms and last is not None and last.attempt == attempt:
            cut = _split_form_start(last.text, text, forms)
            if cut is not None:  # the previous chunk ends inside a secret: move that part
                text = last.text[cut:] + text
                last.text = last.text[:cut]
                last.save(update_fields=["text"])
        seq = (last.seq if last is not None else 0) + 1
        text = mask(text, forms)
        chunk = JobLogChunk.objects.create(job=job, attempt=attempt, seq=seq, text=text)
        _trim_log(job)
    return chunk


def _split_form_start(before: str, text: str, forms) -> int | None:
    """Where in `before` the earliest secret form starts that continues into `text`."""
    starts = []
    for form, _ in forms:
        tail = before[-(len(form) - 1) :] if len(form) > 1 else ""
        found = (tail + text[: len(form) - 1]).find(form)
        if tail and found != -1 and found < len(tail):
            starts.append(len(before) - len(tail) + found)
    return min(starts) if starts else None


def secret_forms(job: Job) -> list[tuple[str, str]]:
    """(what to find, what to show instead) for each secret of the job: its value and the
    forms a job most often prints it in — base64 (standard and URL-safe, padded or not), hex
    (lower and upper case) and URL-encoded (%20 or +) — longest first, so that no form is left
    half masked by a shorter one."""
    names = set((job.secrets or {}).values())
    if not names:
        return []
    forms = {}
    for secret in TenantSecret.objects.filter(tenant_id=job.tenant_id, name__in=names):
        value = secret.reveal()
        if len(value) < REDACT_MIN_CHARS:
            continue
        raw = value.encode()
        label = f"[secret {secret.name}]"
        b64, b64url = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
        for form in (
            value,
            b64,
            b64.rstrip("="),
            b64url,
            b64url.rstrip("="),
            raw.hex(),
            raw.hex().upper(),
            urllib.parse.quote(value, safe=""),
            urllib.parse.quote(value),
            urllib.parse.quote_plus(value),
        ):
            forms.setdefault(form, label)
    return sorted(forms.items(), key=lambda item: -len(item[0]))


def mask(text: str, forms: list[tuple[str, str]]) -> str:
    for form, label in forms:
        if form in text:
            text = text.replace(form, label)
    return text


def _redact(job: Job, text: str) -> str:
    forms = secret_forms(job)
    return mask(text, forms) if forms else text


def _trim_log(job: Job) -> None:
    """Deletes the oldest chunks beyond the newest LOG_KEEP_BYTES (the straddling one too)."""
    newer = Window(Sum(Length("text")), order_by=F("seq").desc())
    old = job.log_chunks.annotate(newer=newer).filter(newer__gt=LOG_KEEP_BYTES).values("pk")
    old_ids = list(old)
    if old_ids:
        JobLogChunk.objects.filter(pk__in=[row["pk"] for row in old_ids]).delete()


def job_log_tail(job: Job, lines: int = 1000) -> str:
    """The last `lines` lines of the job's log (every attempt, oldest first)."""
    if not 1 <= lines <= LOG_TAIL_MAX_LINES:
        raise ValidationError({"tail": f"Between 1 and {LOG_TAIL_MAX_LINES} lines."})
    pieces, newlines = [], 0
    # newest first, only as many chunks as the tail needs
    for text in job.log_chunks.order_by("-seq").values_list("text", flat=True).iterator():
        pieces.append(text)
        newlines += text.count("\n")
        if newlines > lines:
            break
    # masked again as a whole: a value the agent's chunking split in two is caught here
    log = _redact(job, "".join(reversed(pieces)))
    kept = log.splitlines(keepends=True)[-lines:]
    return "".join(kept)


class _Hashing(File):
    """Hands the storage the upload chunk by chunk, hashing and counting it on the way and
    refusing it past the size limit. (Not a temporary upload: the storage cannot move the
    file behind our back, so every byte is hashed.)"""

    def __init__(self, fileobj, limit: int):
        super().__init__(fileobj)
        self.sha256 = hashlib.sha256()
        self.count = 0
        self.limit = limit

    def chunks(self, chunk_size=None):
        for chunk in super().chunks(chunk_size):
            if isinstance(chunk, str):
                chunk = chunk.encode()
            self.count += len(chunk)
            if self.count > self.limit:
                raise ValidationError({"files": f"An output has at most {self.limit} bytes."})
            self.sha256.update(chunk)
            yield chunk


class _Tally:
    """What `EncryptingReader` hands each plaintext chunk to: hashed, counted, refused past the
    size limit."""

    def __init__(self, limit: int):
        self.sha256 = hashlib.sha256()
        self.count = 0
        self.limit = limit

    def __call__(self, chunk: bytes) -> None:
        self.count += len(chunk)
        if self.count > self.limit:
            raise ValidationError({"files": f"An output has at most {self.limit} bytes."})
        self.sha256.update(chunk)


def job_output_store(*, job: Job, attempt: int, name: str, fileobj) -> JobOutput:
    """Stores one output file of an attempt, replacing the output of the same name and attempt.
    `name` is a plain file name (pools.validation.file_name): it can never leave the job's
    folder. The file is sealed under the tenant's data key as it streams into the storage
    (jobs/encryption_at_rest.py): what the storage holds is ciphertext, a chunk at a time in
    memory; the row's size and sha256 are the plaintext's."""
    validation.file_name(name)
    storage = default_storage
    limit = settings.JOB_OUTPUT_MAX_BYTES
    data_key = data_key_for(job.tenant_id)
    content = _Tally(limit)
    sealed = File(EncryptingReader(fileobj, key=data_key, on_plaintext=content))
    path = storage.get_available_name(
        output_upload_to(JobOutput(job=job, attempt=attempt, name=name), name), max_length=400
    )
    try:
        path = storage.save(path, sealed, max_length=400)
    except BaseException:
        if storage.exists(path):  # a partial file of a refused or failed upload
            storage.delete(path)
        raise
    replaced = None
    try:
        with transaction.atomic():
            Job.objects.select_for_update().filter(pk=job.pk).values("pk").first()
            replaced = JobOutput.objects.filter(job=job, attempt=attempt, name=name).first()
            if replaced is not None:
                replaced.delete()
                stale = replaced.file.name
                transaction.on_commit(lambda: storage.delete(stale))
            # the tenant's storage quota in the pool (409 quota_exceeded, storage_mib)
            check_storage(job.tenant_id, job.pool_id, content.count)
            output = JobOutput.objects.create(
                job=job,
                attempt=attempt,
                name=name,
                size=content.count,
                sha256=content.sha256.hexdigest(),
                file=path,
                data_key=data_key,
            )
    except BaseException:
        storage.delete(path)
        raise
    return output


def output_open(output: JobOutput):
    """The output's plaintext as a binary file object, decrypted as it is read (an output
    stored before outputs were sealed: the stored file itself); the caller closes it.
    OutputUnreadable (jobs/encryption_at_rest.py) when it does not open: its header and first
    chunk are checked here, before anything is sent; a chunk altered further on raises it when
    it is read. An output kept in an object store (`location`) is not ours to open."""
    if output.location or not output.file.name:
        raise ValueError(f"output {output.pk} is kept at {output.location or 'no place'}")
    stored = output.file.storage.open(output.file.name, "rb")
    if output.data_key_id is None:
        return stored
    try:
        if output.data_key.tenant_id != output.job.tenant_id:
            raise OutputUnreadable("sealed under another tenant's data key")
        return io.BufferedReader(DecryptingReader(stored, key=output.data_key), CHUNK_BYTES)
    except BaseException:
        stored.close()
        raise


def job_outputs(job: Job):
    """The outputs of the newest attempt that uploaded any (an empty queryset when none)."""
    newest = job.outputs.aggregate(newest=Max("attempt"))["newest"]
    return job.outputs.filter(attempt=newest).order_by("name")


# --- retention ------------------------------------------------------------------------------


def _expirable(pool, now, tenants_days: dict[int, int]):
    """The pool's jobs that ended longer ago than their retention (the tenant's days in the
    pool, else the pool's knob) and still keep outputs or a log."""
    default = knobs_for(pool).output_retention_days
    by_days: dict[int, list[int]] = {}
    for tenant_id, days in tenants_days.items():
        by_days.setdefault(days, []).append(tenant_id)
    ended = Q(state_changed_at__lte=now - timedelta(days=default)) & ~Q(
        tenant_id__in=list(tenants_days)
    )
    for days, tenant_ids in by_days.items():
        ended |= Q(tenant_id__in=tenant_ids, state_changed_at__lte=now - timedelta(days=days))
    return (
        Job.objects.filter(pool=pool, state__in=TERMINAL)
        .filter(ended)
        .filter(
            Exists(JobOutput.objects.filter(job=OuterRef("pk")))
            | Exists(JobLogChunk.objects.filter(job=OuterRef("pk")))
        )
    )


def expire_artifacts(*, now=None) -> int:
    """Deletes the outputs (files and rows) and logs of jobs that ended more than their
    retention ago (jobs/retention.py: the tenant's days for the pool, else for every pool, else
    the pool's `output_retention_days`); returns how many jobs were cleared (at most
    SWEEP_BATCH per pool: the next sweep takes the rest). Each job in its own transaction
    (pools.sweeps.sweep, SKIP LOCKED: safe on several workers); a job that fails is recorded
    (`sweep_failed`) and kept for the next sweep, the others go on."""
    now = now or timezone.now()
    actor = Actor.system("artifact-retention")
    cleared = 0
    for pool in ComputePool.objects.order_by("pk"):
        days = retention.tenants_days(pool)
        default = knobs_for(pool).output_retention_days
        done = sweep(
            _expirable(pool, now, days),
            lambda job, days=days, default=default: _expire_job(
                job, days=days.get(job.tenant_id, default), actor=actor, now=now
            ),
            event_model=JobEvent,
            actor=actor,
            now=now,
        )
        for pk in done:  # once its rows are gone for good
            _remove_empty_folders(default_storage, pk)
        cleared += len(done)
    return cleared


def _expire_job(job: Job, *, days: int, actor: Actor, now) -> None:
    outputs = list(job.outputs.all())
    # Files first, inside the transaction: a file that cannot be deleted rolls the rows back,
    # and the next sweep tries again (deleting a file already gone is a no-op). An output kept
    # in the tenant's own bucket (`location`) is the bucket's: only its row goes.
    for output in outputs:
        if output.file.name and not output.location:
            default_storage.delete(output.file.name)
    job.outputs.all().delete()
    chunks, _ = job.log_chunks.all().delete()
    event = JobEvent.record(
        job,
        actor=actor,
        from_state=job.state,
        to_state=job.state,
        reason=Reason.ARTIFACTS_EXPIRED,
        message=f"outputs and log deleted {days} days after the job ended",
        at=now,
        data={"outputs": len(outputs), "log_chunks": chunks},
    )
    transaction.on_commit(lambda: publish_job_event(job, event))


def _remove_empty_folders(storage, job_id: int) -> None:
    """outputs/<job>/<attempt>/ left empty on a local storage (the storage API deletes files,
    not folders); anything still inside stays."""
    try:
        root = storage.path(f"outputs/{job_id}")
    except NotImplementedError:  # not a local file system: no folders to tidy
        return
    if not os.path.isdir(root):
        return
    for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
