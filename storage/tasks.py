from celery import shared_task

from pools.tasktime import parse_now
from storage import services


@shared_task(name="storage.expire_volumes")
def expire_volumes(now=None) -> int:
    """Hourly (config/celery.py): volumes detached past their retention."""
    return services.expire_volumes(now=parse_now(now))
