"""The Celery app's own behaviour (config/celery.py) against the real Redis broker."""

import uuid

import pytest
import redis
from django.conf import settings
from kombu import Connection, Exchange, Queue

import config.celery  # noqa: F401  (applies the broker-restart fix)


@pytest.fixture
def queue_name():
    name = f"test-unacked-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(name)


def test_a_broker_connection_lost_with_unacked_messages_leaves_them_to_redis(queue_name):
    """kombu 5.7.0 closed the transport before the channel on a lost connection and then
    crashed restoring the unacknowledged messages (the worker exited): now the close goes
    through and the message waits in Redis's unacked set for the visibility timeout."""
    connection = Connection(settings.CELERY_BROKER_URL)
    channel = connection.default_channel
    queue = Queue(queue_name, Exchange(queue_name), queue_name)(channel)
    queue.declare()
    connection.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key=queue_name)
    message = queue.get(no_ack=False)
    assert message is not None and message.payload == {"n": 1}

    connection._do_close_transport()  # the order kombu's error path took
    connection._do_close_self()  # raised AttributeError ('hostname') before the fix

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        assert client.hexists("unacked", message.delivery_tag)  # not lost
    finally:
        client.hdel("unacked", message.delivery_tag)
        client.zrem("unacked_index", message.delivery_tag)
