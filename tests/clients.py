"""API clients as a CLI or an agent would be: a bearer credential built by config.builders."""

from rest_framework.test import APIClient

from config.builders import build_node_credential, build_token


def bearer_client(secret: str | None = None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def client_for(user=None, scopes=None, *, node=None) -> APIClient:
    """A person's token client (scopes: the default, pools.services.DEFAULT_TOKEN_SCOPES), a
    node agent's credential client, or anonymous (neither)."""
    if node is not None:
        return bearer_client(build_node_credential(node))
    return bearer_client(build_token(user, scopes=scopes) if user is not None else None)
