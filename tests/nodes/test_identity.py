"""Node identity (docs/security.md "Node identity"): a node credential is useless without the
node's key; replays, tampered bodies, stale and foreign signatures are refused; rotation keeps
the binding; enrolling as a known node with another key is refused (or quarantines it)."""

import datetime
import hashlib
import os
import stat

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from rest_framework.test import APIClient

from config.builders import NODE_KEYS, set_pool_knobs, submit_job
from jobs.models import JobOutput
from nodes.models import Node, NodeCredential, NodeEvent
from nodes.services import enrollment_token_issue
from pools.actors import Actor
from tests.clients import SignedClient, bearer_client, enroll_post
from tests.jobs.test_agent_api import place, run
from worker_agent.agent import AgentError, load_key
from worker_agent.identity import (
    UPLOAD_DIGEST,
    KeyRefused,
    NodeKey,
    default_key_file,
    digest_field,
    rotation_statement,
)

pytestmark = pytest.mark.django_db
ME = "/api/v1/agent/me/"
HEARTBEAT = "/api/v1/agent/heartbeat/"


def reasons(node) -> list[str]:
    return list(NodeEvent.objects.filter(node=node).order_by("id").values_list("reason", flat=True))


def signed_headers(key: NodeKey, method: str, path: str, body: bytes = b"", **sign) -> dict:
    """The signature headers of one request as the test client's extra (HTTP_…)."""
    request = requests.Request(method, f"http://control-plane{path}", data=body).prepare()
    key.sign(request)
    return {
        "HTTP_" + name.upper().replace("-", "_"): request.headers[name]
        for name in ("Signature", "Signature-Input", "Content-Digest")
    }


def test_a_stolen_credential_without_the_key_is_refused_and_recorded(ready_node):
    thief = APIClient()
    thief.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    for _ in range(3):
        answer = thief.get(ME)
        assert answer.status_code == 401
        assert answer.json()["code"] == "signature_refused"
    # the node's own agent goes on
    assert bearer_client(ready_node.secret).get(ME).status_code == 200
    # recorded once (a minute), not once per attempt: the thief cannot flood the event log
    assert reasons(ready_node.node).count("signature_refused") == 1


def test_a_signature_by_another_key_is_refused(ready_node):
    other = SignedClient(NodeKey.generate())
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    answer = other.get(ME)
    assert answer.status_code == 401 and "another key" in answer.json()["detail"]


def test_a_replayed_signed_request_is_refused(ready_node):
    key = NODE_KEYS[ready_node.node.pk]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    headers = signed_headers(key, "GET", ME)
    assert client.get(ME, **headers).status_code == 200
    replay = client.get(ME, **headers)
    assert replay.status_code == 401 and "replay" in replay.json()["detail"]


def test_a_body_other_than_the_signed_one_is_refused(ready_node):
    key = NODE_KEYS[ready_node.node.pk]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    signed = b'{"usage": {"cpu_millicores": 1}}'
    headers = signed_headers(key, "POST", HEARTBEAT, signed)
    tampered = client.post(
        HEARTBEAT,
        b'{"usage": {"cpu_millicores": 99999}}',
        content_type="application/json",
        **headers,
    )
    assert tampered.status_code == 401 and "digest" in tampered.json()["detail"].lower()
    # and a signature made for another path does not open this one
    headers = signed_headers(key, "GET", "/api/v1/agent/probes/")
    assert client.get(ME, **headers).status_code == 401


def test_a_stale_signature_is_refused(ready_node, monkeypatch):
    key = NODE_KEYS[ready_node.node.pk]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    request = requests.Request("GET", f"http://control-plane{ME}").prepare()
    past = datetime.datetime.now() - datetime.timedelta(minutes=10)
    from http_message_signatures import HTTPMessageSigner, algorithms

    from worker_agent import identity

    signer = HTTPMessageSigner(
        signature_algorithm=algorithms.ED25519, key_resolver=identity._Resolver(key)
    )
    signer.sign(
        request,
        key_id=key.fingerprint,
        label=identity.LABEL,
        tag=identity.TAG,
        nonce="a-nonce-of-some-length",
        created=past,
        covered_component_ids=list(identity.COVERED[:-1]),
        body=b"",
    )
    headers = {
        "HTTP_" + name.upper().replace("-", "_"): request.headers[name]
        for name in ("Signature", "Signature-Input", "Content-Digest")
    }
    answer = client.get(ME, **headers)
    assert answer.status_code == 401 and "does not verify" in answer.json()["detail"]


def test_without_the_nonce_store_signed_requests_are_refused_503_not_let_through(ready_node):
    dead = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:9/0",  # nothing listens on the discard port
        "OPTIONS": {"socket_connect_timeout": 0.2, "socket_timeout": 0.2},
    }
    from django.conf import settings

    with override_settings(CACHES=settings.CACHES | {"nonces": dead}):
        from django.core.cache import caches

        caches._settings = None  # re-read
        answer = bearer_client(ready_node.secret).get(ME)
    assert answer.status_code == 503 and answer.json()["code"] == "nonce_store_unavailable"


def test_enrollment_is_signed_by_the_key_it_binds(private_pool, operator):
    _, token = enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    body = {
        "token": token,
        "name": "gpu-x",
        "inventory": {"cpu_millicores": 4000, "memory_mib": 8192, "scratch_mib": 0, "gpus": []},
    }
    mine, impostor = NodeKey.generate(), NodeKey.generate()
    # a public key the request is not signed by: refused, and nothing enrolled
    forged = SignedClient(impostor).post(
        "/api/v1/enroll/", body | {"public_key": mine.public_key}, format="json"
    )
    assert forged.status_code == 401
    assert not Node.objects.filter(name="gpu-x").exists()
    answer = enroll_post(body, key=mine)
    assert answer.status_code == 201, answer.content
    node = Node.objects.get(name="gpu-x")
    assert node.public_key == mine.public_key and node.identity_fingerprint == mine.fingerprint


def test_rotation_keeps_the_node_and_its_credential_and_retires_the_old_key(ready_node):
    node, old = ready_node.node, NODE_KEYS[ready_node.node.pk]
    new = NodeKey.generate()
    agent = bearer_client(ready_node.secret)
    statement = rotation_statement(node.pk, old.fingerprint, new.fingerprint)
    # a proof by a third key is no proof
    bad = agent.post(
        "/api/v1/agent/key/rotate/",
        {"public_key": new.public_key, "proof": NodeKey.generate().sign_bytes(statement)},
        format="json",
    )
    assert bad.status_code == 409 and bad.json()["code"] == "node_key_proof_invalid"
    answer = agent.post(
        "/api/v1/agent/key/rotate/",
        {"public_key": new.public_key, "proof": new.sign_bytes(statement)},
        format="json",
    )
    assert answer.status_code == 200 and answer.json()["identity_fingerprint"] == new.fingerprint
    assert agent.get(ME).status_code == 401  # the old key opens nothing now
    renewed = SignedClient(new)
    renewed.credentials(HTTP_AUTHORIZATION=f"Bearer {ready_node.secret}")
    assert renewed.get(ME).json()["id"] == node.pk  # same node, same credential
    assert "node_key_rotated" in reasons(node)


def test_enrolling_again_with_the_nodes_own_key_gets_a_new_credential(
    private_pool, operator, ready_node
):
    node, key = ready_node.node, NODE_KEYS[ready_node.node.pk]
    _, token = enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inventory = {"cpu_millicores": 4000, "memory_mib": 8192, "scratch_mib": 0, "gpus": []}
    answer = enroll_post({"token": token, "name": node.name, "inventory": inventory}, key=key)
    assert answer.status_code == 201, answer.content
    assert answer.json()["node"]["id"] == node.pk
    assert bearer_client(ready_node.secret).get(ME).status_code == 401  # the old one revoked
    assert bearer_client(answer.json()["credential"]).get(ME).status_code == 200
    assert reasons(node)[-1] == "node_reenrolled"


@pytest.mark.parametrize("policy", ["refuse", "quarantine"])
def test_enrolling_as_a_known_node_with_another_key_is_refused(
    private_pool, operator, ready_node, policy
):
    set_pool_knobs(private_pool, reenrollment_key_mismatch=policy)
    node = ready_node.node
    _, token = enrollment_token_issue(pool=private_pool, actor=Actor.for_user(operator))
    inventory = {"cpu_millicores": 4000, "memory_mib": 8192, "scratch_mib": 0, "gpus": []}
    answer = enroll_post({"token": token, "name": node.name, "inventory": inventory})
    assert answer.status_code == 403 and answer.json()["code"] == "identity_key_mismatch"
    node.refresh_from_db()
    assert node.identity_fingerprint == NODE_KEYS[node.pk].fingerprint  # unchanged
    assert "identity_key_mismatch" in reasons(node)
    assert node.state == ("quarantined" if policy == "quarantine" else "ready")
    assert NodeCredential.objects.filter(node=node, revoked_at__isnull=True).exists()


def test_a_streamed_upload_must_be_the_file_its_signature_names(agent, tenant):
    """The agent signs an output upload over the file's SHA-256 (`Upload-Digest`), not over
    the streamed body: a body that carries another file is refused, and nothing is stored."""
    job, lease = place(submit_job(agent.node.pool, tenant))
    node_api = bearer_client(agent.secret)
    run(node_api, job, lease)
    path = f"/api/v1/agent/jobs/{job.pk}/outputs"
    body = encode_multipart(
        BOUNDARY,
        {"fencing_token": str(lease.fencing_token), "files": SimpleUploadedFile("a.txt", b"evil")},
    )

    def send(content: bytes):
        digest = digest_field(hashlib.sha256(content).digest())
        streamed = requests.Request(
            "POST", f"http://control-plane{path}", data=iter([b""]), headers={UPLOAD_DIGEST: digest}
        ).prepare()
        NODE_KEYS[agent.node.pk].sign(streamed)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.secret}")
        headers = {
            "HTTP_" + name.upper().replace("-", "_"): streamed.headers[name]
            for name in ("Signature", "Signature-Input", UPLOAD_DIGEST)
        }
        return client.post(path, body, content_type=MULTIPART_CONTENT, **headers)

    refused = send(b"good")
    assert refused.status_code == 400 and "not the one the signature names" in str(refused.json())
    assert not JobOutput.objects.filter(job=job).exists()
    assert send(b"evil").status_code == 201
    assert JobOutput.objects.get(job=job).sha256 == hashlib.sha256(b"evil").hexdigest()


def test_the_agents_key_file_is_its_own_0400_outside_state_and_work(tmp_path):
    state, work = tmp_path / "state", tmp_path / "state.work"
    state.mkdir()
    work.mkdir()
    path = default_key_file(state)
    assert path == tmp_path / "state.key" / "node.key"
    key = load_key(path, (work, state))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert load_key(path, (work, state)).fingerprint == key.fingerprint  # kept across starts
    with pytest.raises(AgentError, match="must not be inside"):
        load_key(state / "node.key", (work, state))
    with pytest.raises(AgentError, match="must not be inside"):
        load_key(work / "k" / "node.key", (work, state))
    os.chmod(path, 0o644)
    with pytest.raises(KeyRefused, match="readable by others"):
        NodeKey.load(path)
