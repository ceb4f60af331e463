"""The API's answer when its database stops answering mid-service (pools/api/errors.py): a 503
that clients retry, not a 500 (found by the drill's PostgreSQL restart, issue 25)."""

import psycopg
import pytest
from django.db import connection

from config.builders import build_person, build_tenant, build_token
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
