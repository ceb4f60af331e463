"""Test settings: the real services (PostgreSQL, Redis), only made faster where it is safe."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/computepool")

from .settings import *  # noqa: F403
from .settings import DATABASES, LOOPBACK_REGISTRY_HOSTS

DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get(
    "TEST_DATABASE_NAME", "test_computepool"
)
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
# No pass on events: a test places with the pass when it means to (inline tasks would place
# every job at its submit). Tests of the triggers turn it on (tests/scheduling/test_triggers.py).
SCHEDULER_EVENT_PASSES = False
# Tests of one tenant run in the same minute across the suite: the placement throttle is off,
# except where a test sets a rate (tests/security/test_limits.py).
PLACEMENT_THROTTLE_RATE = ""
LEASE_THROTTLE_RATE = ""  # the same for lease creation per tenant and expensive calls per token
TOKEN_THROTTLE_RATE = ""
# A fixed key ring (never a real one); rotation tests put another key before it.
ENCRYPTION_KEYS = {"test-1": "dGVzdC1rZXktb25lLXRlc3Qta2V5LW9uZS10ZXN0LWs="}
# The loopback registry with the test image (.ci/ensure-services.sh), over plain http.
REGISTRY_INSECURE_HOSTS = LOOPBACK_REGISTRY_HOSTS
# A volume's export job runs the loopback registry's busybox (jobs/volume_export.py).
VOLUME_EXPORT_IMAGE = "127.0.0.1:5000/computepool/busybox:test"
