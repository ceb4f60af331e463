from datetime import timedelta
from functools import partial

from django.utils import timezone

from config.celery import app
from pools.actors import Actor
from pools.models import ApiToken, SupportGrant
from pools.services import (
    api_token_issue,
    api_token_revoke,
    support_grant_create,
    support_grant_revoke,
)
from pools.tasks import expire_support_grants, purge_api_tokens


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


def test_the_support_grant_sweep_expires_only_grants_past_their_expiry(tenant_admin, operator):
    now = timezone.now()
    admin = Actor.for_user(tenant_admin)
    grant = partial(support_grant_create, tenant=tenant_admin.memberships.get().tenant)
    due = grant(
        operator="operator",
        ttl=timedelta(hours=1),
        reason="a",
        actor=admin,
        now=now - timedelta(hours=2),
    )
    revoked = grant(
        operator="operator",
        ttl=timedelta(hours=1),
        reason="b",
        actor=admin,
        now=now - timedelta(hours=2),
    )
    support_grant_revoke(grant=revoked, actor=admin, now=now - timedelta(hours=1, minutes=30))
    live = grant(operator="operator", ttl=timedelta(hours=1), reason="c", actor=admin, now=now)
    assert expire_support_grants.delay().get() == 1
    states = {g.reason: g.state for g in SupportGrant.objects.all()}
    assert states == {"a": "expired", "b": "revoked", "c": "active"}
    assert due.events.filter(reason="support_expired").count() == 1
    assert live.events.count() == 1 and revoked.events.count() == 2
    schedule = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert "pools.expire_support_grants" in schedule
