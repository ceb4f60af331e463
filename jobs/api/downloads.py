"""An output's bytes as an HTTP answer (the tenant's download, the agent's checkpoint): the
plaintext, decrypted as it streams out (jobs/artifacts.py `output_open`), a chunk at a time in
memory; Content-Length is the plaintext's size and X-Checksum-Sha256 its digest."""

import logging

from django.http import FileResponse
from rest_framework.exceptions import APIException

from jobs import artifacts
from jobs.encryption_at_rest import CHUNK_BYTES, OutputUnreadable
from pools.encryption import EncryptionError

log = logging.getLogger(__name__)


class OutputUnavailable(APIException):
    status_code = 409
    default_code = "output_unreadable"
    default_detail = (
        "This output cannot be read back: it does not decrypt with its tenant's data key "
        "(operators: the server's log says why)."
    )


class EncryptionUnavailable(APIException):
    status_code = 503
    default_code = "encryption_unavailable"
    default_detail = (
        "Outputs are stored encrypted and the control plane's key ring (ENCRYPTION_KEYS) cannot "
        "seal them now: an operator must configure it."
    )


class _Streamed(FileResponse):
    block_size = CHUNK_BYTES  # one sealed chunk per read, not 4 KiB


def output_response(output, *, filename: str, content_type: str) -> FileResponse:
    try:
        stream = artifacts.output_open(output)
    except (OutputUnreadable, EncryptionError) as error:
        log.error("output %s (%s) does not open: %s", output.pk, output.file.name, error)
        raise OutputUnavailable() from None
    response = _Streamed(stream, as_attachment=True, filename=filename, content_type=content_type)
    response["Content-Length"] = str(output.size)
    response["X-Checksum-Sha256"] = output.sha256
    return response
