"""Node agent authentication: `Authorization: Bearer cpn_…`, looked up by digest, AND a
signature by the key bound to that node (nodes/signatures.py): the credential alone is refused.

The principal is a `NodePrincipal`, never a person: `Actor.from_request` makes it the node's
actor, which every person-only permission (IsPerson, IsOperator …) refuses, so a node
credential reaches only the agent endpoints, and those act on its own node alone.
"""

from django.utils import timezone
from rest_framework import authentication, exceptions

from pools.actors import NodePrincipal

from .services import CREDENTIAL_PREFIX, credential_for_secret, signature_refused
from .signatures import SignatureRefused, verify


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"
    prefix = CREDENTIAL_PREFIX

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme != self.keyword or not secret.startswith(self.prefix):
            return None  # a person's token or a session; another authenticator decides
        credential, why = credential_for_secret(secret, now=timezone.now())
        if credential is None:
            raise exceptions.AuthenticationFailed(f"Node credential refused: {why}.")
        node = credential.node
        try:
            verify(
                getattr(request, "_request", request),  # DRF's Request, or Django's (tests)
                public_key=node.public_key,
                fingerprint=node.identity_fingerprint,
            )
        except SignatureRefused as exc:
            signature_refused(node=node, why=str(exc.detail))
            raise
        return NodePrincipal(node, credential), credential

    def authenticate_header(self, request):
        return self.keyword
