from datetime import timedelta

from django.utils import timezone

from pools.models import ApiToken
from pools.services import api_token_issue, api_token_revoke
from pools.tasks import purge_api_tokens


def test_purge_forgets_only_long_dead_tokens(member):
    now = timezone.now()
    api_token_issue(user=member, name="live")
    api_token_issue(user=member, name="old", now=now - timedelta(days=200), ttl=timedelta(days=90))
    api_token_issue(
        user=member, name="recent", now=now - timedelta(days=100), ttl=timedelta(days=90)
    )
    old_revoked, _ = api_token_issue(user=member, name="revoked")
    api_token_revoke(token=old_revoked, now=now - timedelta(days=31))
    assert purge_api_tokens.delay().get() == 2
    assert set(ApiToken.objects.values_list("name", flat=True)) == {"live", "recent"}
    assert purge_api_tokens.delay().get() == 0
