"""Thin Celery tasks for pools; each calls one service with `now`."""

from celery import shared_task
from django.utils import timezone

from . import services


@shared_task(name="pools.purge_api_tokens")
def purge_api_tokens() -> int:
    return services.api_tokens_purge(now=timezone.now())


@shared_task(name="pools.expire_support_grants")
def expire_support_grants() -> int:
    return services.support_grants_expire(now=timezone.now())
