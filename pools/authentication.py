"""API token authentication for people: `Authorization: Bearer cpu_…`, looked up by digest."""

from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import ApiToken, token_digest


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"
    prefix = "cpu_"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, secret = header.partition(" ")
        if scheme != self.keyword or not secret.startswith(self.prefix):
            return None  # not ours; another authenticator (node credential, session) may match
        token = (
            ApiToken.objects.select_related("user")
            .filter(digest=token_digest(secret.strip()))
            .first()
        )
        now = timezone.now()
        if token is None or not token.is_valid(now) or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        # Update last use at most once a minute, so a busy token does not write every request.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
