"""The agent's side of an s3:// output (worker_agent/presigned.py), against the local S3 server
over HTTP: a presigned PUT goes only to a registered store's origin, carries exactly the
announced bytes and headers, and never follows a redirect."""

import hashlib
import http.server
import threading

import pytest

from pools import objectstore
from tests.storage.s3server import (
    ACCESS_KEY_ID,
    REGION,
    SECRET_ACCESS_KEY,
    STORE,
    new_bucket,
    s3,  # noqa: F401 (fixture)
)
from worker_agent import presigned

pytestmark = pytest.mark.usefixtures("s3")


def signed_put(bucket, key, data, sse="AES256"):
    target = objectstore.Target(STORE, REGION, bucket, ACCESS_KEY_ID, SECRET_ACCESS_KEY, sse)
    digest = hashlib.sha256(data).hexdigest()
    return objectstore.presign_put(target, key, size=len(data), sha256=digest, expires_s=60)


def test_a_presigned_put_stores_the_announced_file_with_its_digest(s3):  # noqa: F811
    bucket, data = new_bucket(), b"x" * 70_000
    signed = signed_put(bucket, "k/out.bin", data)
    assert ACCESS_KEY_ID in signed["url"] and SECRET_ACCESS_KEY not in signed["url"]
    chunks = (data[i : i + 8192] for i in range(0, len(data), 8192))
    presigned.put(signed["url"], signed["headers"], len(data), chunks, endpoints=[STORE])
    head = s3.head_object(Bucket=bucket, Key="k/out.bin")
    assert head["ContentLength"] == len(data)
    assert head["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest()


def test_the_agent_sends_exactly_the_announced_size(s3):  # noqa: F811
    bucket = new_bucket()
    signed = signed_put(bucket, "short.bin", b"12345")
    with pytest.raises(OSError, match="not 5"):
        presigned.put(signed["url"], signed["headers"], 5, iter([b"123"]), endpoints=[STORE])
    with pytest.raises(OSError, match="grew past"):
        presigned.put(signed["url"], signed["headers"], 5, iter([b"1234567"]), endpoints=[STORE])
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_only_registered_origins_and_no_redirects():
    signed = {"url": f"{STORE}/b/k?X-Amz-Signature=1", "headers": {}}
    for endpoints in ([], ["http://127.0.0.1:9001"], ["https://127.0.0.1:9000"]):
        with pytest.raises(presigned.PutRefused, match="no registered"):
            presigned.put(signed["url"], {}, 1, iter([b"1"]), endpoints=endpoints)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", "http://169.254.169.254/latest/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(presigned.PutRefused, match="307"):
            presigned.put(f"{origin}/b/k?s=1", {}, 1, iter([b"1"]), endpoints=[origin])
    finally:
        server.shutdown()
