"""API clients as a CLI or an agent would be: a bearer credential built by config.builders; an
agent's client also signs every request with its node's key, as worker_agent/client.py does."""

import hashlib
from urllib.parse import urlencode, urlsplit

import requests
from django.core.files.uploadedfile import UploadedFile
from django.utils.encoding import escape_uri_path
from rest_framework.test import APIClient, APIRequestFactory

from config.builders import NODE_KEYS, build_node_credential, build_token
from nodes.models import NodeCredential
from nodes.services import CREDENTIAL_PREFIX
from pools.models import token_digest
from worker_agent.identity import UPLOAD_DIGEST, NodeKey, digest_field


def bearer_client(secret: str | None = None) -> APIClient:
    """A client of `secret`: a node credential's client signs with its node's key (when this
    process bound it: config.builders.NODE_KEYS), as the node's agent would."""
    key = _node_key(secret) if secret else None
    client = SignedClient(key) if key is not None else APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def node_key(secret: str) -> NodeKey | None:
    """The key of the node whose credential `secret` is (None: not one this process bound)."""
    return _node_key(secret)


def _node_key(secret: str) -> NodeKey | None:
    if not secret.startswith(CREDENTIAL_PREFIX):
        return None
    node = NodeCredential.objects.filter(digest=token_digest(secret)).values("node").first()
    return NODE_KEYS.get(node["node"]) if node else None


class Signing:
    """Every request made carries the node key's signature, made as the agent makes it:
    Signature, Signature-Input and Content-Digest over the exact body sent — or, for a
    multipart upload of one file, over that file's `Upload-Digest` (as the agent streams it)."""

    def __init__(self, key: NodeKey, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key = key
        self._upload_digest = None

    def post(self, path, data=None, format=None, *args, **kwargs):
        values = data.values() if isinstance(data, dict) else ()
        files = [f for value in values for f in (value if isinstance(value, list) else [value])]
        uploads = [f for f in files if isinstance(f, UploadedFile)]
        if format == "multipart" and len(uploads) == 1:
            content = uploads[0].read()
            uploads[0].seek(0)
            self._upload_digest = digest_field(hashlib.sha256(content).digest())
        try:
            return super().post(path, data, format, *args, **kwargs)
        finally:
            self._upload_digest = None

    def generic(self, method, path, data="", content_type="application/octet-stream", **extra):
        parts = urlsplit(str(path))
        query = extra.get("QUERY_STRING") or parts.query
        if extra.get("query_params"):
            query = urlencode(extra["query_params"], doseq=True)
        target = escape_uri_path(parts.path) + (f"?{query}" if query else "")
        body = data.encode() if isinstance(data, str) else (data or b"")
        url = f"http://control-plane{target}"
        if self._upload_digest:  # a streamed body, signed over its file's digest
            headers = {UPLOAD_DIGEST: self._upload_digest}
            request = requests.Request(method.upper(), url, data=iter([b""]), headers=headers)
            names = ("Signature", "Signature-Input", UPLOAD_DIGEST)
        else:
            request = requests.Request(method.upper(), url, data=body)
            names = ("Signature", "Signature-Input", "Content-Digest")
        signed = self.key.sign(request.prepare())
        for name in names:
            extra["HTTP_" + name.upper().replace("-", "_")] = signed.headers[name]
        return super().generic(method, path, data, content_type, **extra)


class SignedClient(Signing, APIClient):
    """An APIClient of a node's agent."""


class SignedFactory(Signing, APIRequestFactory):
    """An APIRequestFactory whose requests a node's agent signed."""


def node_client(node, secret: str | None = None) -> SignedClient:
    """The agent of `node`: its credential (a new one unless `secret` is given) and its key."""
    secret = secret or build_node_credential(node)
    client = SignedClient(NODE_KEYS[node.pk])
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def client_for(user=None, scopes=None, *, node=None) -> APIClient:
    """A person's token client (scopes: the default, pools.services.DEFAULT_TOKEN_SCOPES), a
    node agent's credential client (signed by its key), or anonymous (neither)."""
    if node is not None:
        return node_client(node)
    return bearer_client(build_token(user, scopes=scopes) if user is not None else None)


def enroll_post(body: dict, key: NodeKey | None = None):
    """POST /api/v1/enroll/ as an agent makes it: `body` with its key's `public_key` (unless
    it names one), signed by that key (a new one unless `key` is given)."""
    key = key or NodeKey.generate()
    response = SignedClient(key).post(
        "/api/v1/enroll/", {"public_key": key.public_key} | body, format="json"
    )
    if response.status_code == 201:  # the node's later requests are signed by it
        NODE_KEYS[response.json()["node"]["id"]] = key
    return response
