"""Settings of the Celery worker that tests/scheduling/test_event_passes.py starts: the test
settings (DATABASE_URL names the test database), tasks run by the worker, not inline, on a queue
of its own (TEST_CELERY_QUEUE) so that no other worker on this Redis takes them."""

import os

from config.settings_test import *  # noqa: F403

CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_DEFAULT_QUEUE = os.environ["TEST_CELERY_QUEUE"]
SCHEDULER_EVENT_PASSES = True
