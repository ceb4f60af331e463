"""Node agent authentication: `Authorization: Bearer cpn_…`, looked up by digest.

The principal is not a person: `is_person = False` makes every person-only permission
(IsPerson, IsOperator …) refuse it, so a node credential reaches only the agent endpoints,
and those act on `request.user.node` alone.
"""

from django.utils import timezone
from rest_framework import authentication, exceptions

from .services import CREDENTIAL_PREFIX, credential_for_secret


class NodePrincipal:
    is_person = False
    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_superuser = False
    is_staff = False
    pk = None
    id = None
    # pools.roles caches: a node holds no platform role and no tenant membership
    _platform_roles = frozenset()
    _tenant_roles: dict = {}

    def __init__(self, node, credential=None):
        self.node = node
        self.credential = credential

    def get_username(self) -> str:
        return f"node:{self.node.name}"

    @property
    def username(self) -> str:
        return self.get_username()

    def __str__(self):
        return self.get_username()


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
        return NodePrincipal(credential.node, credential), credential

    def authenticate_header(self, request):
        return self.keyword
