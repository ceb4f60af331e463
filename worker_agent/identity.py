"""The node's own key (docs/security.md "Node identity"): an Ed25519 key pair the agent makes
before it enrolls, whose public half the control plane binds to the node. Every call the agent
makes is signed with it (HTTP Message Signatures, RFC 9421), so the node credential alone — read
from a leaked state dir, a log, a backup — opens nothing.

The private key is a file of its own, mode 0400, in a 0700 directory that is neither the state
dir nor below the work root: no job's mount can reach it. Its default place is beside the state
dir (`<state dir>.key/node.key`), and `--key-file` puts it anywhere else. A key file that others
can read, or that is not a regular file, is refused rather than used.

What a signature covers: the method, the path and query, `Content-Digest` (SHA-256 of the body),
and for a streamed upload `Upload-Digest` (SHA-256 of the file it carries, which the control
plane checks against what it stored), with `created`, a random `nonce` (the control plane keeps
each one while the signature is fresh: a replay is refused) and `keyid`, the key's fingerprint.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import stat
from pathlib import Path

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms

KEY_FILE = "node.key"
LABEL = "node"  # the signature's label in Signature-Input / Signature
TAG = "compute-pool-node"  # the application tag (RFC 9421 `tag`): what the signature is for
COVERED = ("@method", "@path", "@query", "content-digest")
UPLOAD_DIGEST = "upload-digest"  # a streamed upload's file digest, signed in place of the body


class KeyRefused(Exception):
    """The key file exists but cannot be trusted (others may read it, or it is no key)."""


def rotation_statement(node_id, old: str, new: str) -> bytes:
    """What a new key signs to prove the agent holds it when it replaces the old one: the
    node and both fingerprints (the control plane checks the same bytes)."""
    return f"compute-pool node-key-rotation {node_id} {old} {new}".encode()


def default_key_file(state_dir: str | os.PathLike) -> Path:
    """`<state dir>.key/node.key`: beside the state dir, never inside it or the work root."""
    state = Path(os.path.abspath(state_dir))
    return state.with_name(state.name + ".key") / KEY_FILE


def digest_field(digest: bytes) -> str:
    """A SHA-256 digest as a structured-field dictionary (RFC 9530): `sha-256=:…:`."""
    return f"sha-256=:{base64.b64encode(digest).decode()}:"


class NodeKey:
    def __init__(self, private_key: Ed25519PrivateKey, path: Path | None = None):
        self.private_key, self.path = private_key, path
        raw = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_key = base64.b64encode(raw).decode()  # what enrollment sends
        self.fingerprint = hashlib.sha256(raw).hexdigest()  # the node's identity, the keyid

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike) -> NodeKey:
        """The key at `path`, made (0400, its directory 0700) when there is none."""
        path = Path(path)
        if path.exists() or path.is_symlink():
            return cls.load(path)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        key = cls.generate()
        pem = key.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            os.fchmod(fd, 0o400)
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        key.path = path
        return key

    @classmethod
    def load(cls, path: Path) -> NodeKey:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise KeyRefused(f"{path}: {exc.strerror}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise KeyRefused(f"{path} is not a regular file")
            if info.st_mode & 0o077:
                raise KeyRefused(
                    f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):04o}): "
                    "it must be 0400 or 0600"
                )
            data = os.read(fd, 64 * 1024)
        finally:
            os.close(fd)
        try:
            private_key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyRefused(f"{path} holds no private key: {exc}") from exc
        if not isinstance(private_key, Ed25519PrivateKey):
            raise KeyRefused(f"{path} is not an Ed25519 key")
        return cls(private_key, path)

    def sign_bytes(self, data: bytes) -> str:
        """A detached signature (base64) over `data`: the proof of a key rotation."""
        return base64.b64encode(self.private_key.sign(data)).decode()

    def sign(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        """Signs `request` in place (headers Content-Digest, Signature-Input, Signature).
        A streamed body must carry its file's `Upload-Digest` header; it is signed instead
        of the body's digest, which cannot be known before the body is sent."""
        covered, body = list(COVERED), request.body
        if body is None or isinstance(body, (bytes, str)):
            raw = body.encode() if isinstance(body, str) else (body or b"")
            covered.remove("content-digest")  # the signer adds it, computed from `raw`
        else:
            if UPLOAD_DIGEST not in {name.lower() for name in request.headers}:
                raise ValueError("a streamed body is signed over its Upload-Digest header")
            covered[covered.index("content-digest")] = UPLOAD_DIGEST
            raw = None
        request.headers.pop("Content-Digest", None)  # a retry signs afresh
        _signer(self).sign(
            request,
            key_id=self.fingerprint,
            label=LABEL,
            tag=TAG,
            nonce=secrets.token_urlsafe(18),
            covered_component_ids=covered,
            body=raw,
        )
        return request


class _Resolver(HTTPSignatureKeyResolver):
    def __init__(self, key: NodeKey):
        self.key = key

    def resolve_private_key(self, key_id: str):
        return self.key.private_key

    def resolve_public_key(self, key_id: str):  # pragma: no cover (the agent never verifies)
        return self.key.private_key.public_key()


def _signer(key: NodeKey) -> HTTPMessageSigner:
    return HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=_Resolver(key))


class SignedBy(requests.auth.AuthBase):
    """A requests auth hook: every request it is given goes out signed by the node's key."""

    def __init__(self, key: NodeKey):
        self.key = key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        return self.key.sign(request)
