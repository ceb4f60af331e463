"""The API's answer when its database stops answering mid-service (pools/api/errors.py): a 503
that clients retry, not a 500 (found by the drill's PostgreSQL restart, issue 25)."""

import psycopg
import pytest
from django.db import OperationalError, connection

from config.builders import build_person, build_tenant, build_token
from pools.api.errors import database_unavailable
from tests.clients import bearer_client

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_own_backend() -> None:
    """PostgreSQL ends this process's connection, as a restart does (from another session)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_request_whose_database_connection_was_cut_is_answered_503_to_retry():
    user = build_person("dana", tenant=build_tenant("vision"))
    client = bearer_client(build_token(user))
    assert client.get("/api/v1/jobs").status_code == 200
    _terminate_own_backend()
    answer = client.get("/api/v1/jobs")
    assert answer.status_code == 503
    assert answer["Retry-After"] == "1"
    assert answer.json()["code"] == "unavailable"
    # what a server does at each request's end (the test client leaves it out): the broken
    # connection goes, and the next request has a new one
    connection.close_if_unusable_or_obsolete()
    assert client.get("/api/v1/jobs").status_code == 200


def _operational(sqlstate: str | None) -> OperationalError:
    """Django's wrapping of a psycopg error of that SQLSTATE (None: no state, a lost socket)."""
    exc = OperationalError("it failed")
    exc.__cause__ = psycopg.errors.lookup(sqlstate)("it failed") if sqlstate else None
    return exc


@pytest.mark.parametrize(
    ("sqlstate", "retry"),
    [
        ("57P01", True),  # admin shutdown: a restart
        ("08006", True),  # connection failure
        ("53300", True),  # too many connections
        ("40001", True),  # serialization failure
        (None, True),  # the socket went without a word
        ("58P01", False),  # undefined file: no retry helps
    ],
)
def test_only_a_database_that_was_away_is_answered_503(sqlstate, retry):
    assert database_unavailable(_operational(sqlstate)) is retry
