"""tests/api: the contract. The lease and token throttles are off here unless a test sets a
rate (tests/api/test_limits.py), as the placement throttle is in the test settings."""

import pytest


@pytest.fixture(autouse=True)
def no_lease_or_token_throttle(settings):
    settings.LEASE_THROTTLE_RATE = ""
    settings.TOKEN_THROTTLE_RATE = ""
