"""The agent's HTTP client against a real local HTTP server: credential, retries, 401."""

import socket

import pytest

from worker_agent.client import ApiClient, ApiError, ApiUnreachable
from worker_agent.state import AgentState


@pytest.fixture
def state(tmp_path, control_plane):
    state = AgentState(tmp_path)
    state.save_credential({"credential": control_plane.credential})
    return state


def test_requests_carry_the_node_credential(control_plane, state):
    client = ApiClient(control_plane.url, state)
    control_plane.assignments = [{"job": 1}]
    assert client.assignments() == [{"job": 1}]
    state.save_credential({"credential": "cpn_revoked"})
    with pytest.raises(ApiError) as refused:
        client.assignments()
    assert refused.value.status == 401


def test_unavailable_answers_are_retried_with_backoff(control_plane, state):
    control_plane.statuses = [503, 502]
    client = ApiClient(control_plane.url, state, backoff=0.01)
    assert client.heartbeat({"workloads": []}) == {"ok": True}
    assert len(control_plane.sent("agent/heartbeat")) == 3


def test_a_409_is_not_retried_and_carries_the_code(control_plane, state):
    control_plane.refuse_steps = {"running"}
    client = ApiClient(control_plane.url, state, backoff=0.01)
    with pytest.raises(ApiError) as refused:
        client.report(5, {"fencing_token": "1", "step": "running"})
    assert (refused.value.status, refused.value.code) == (409, "fencing_token_mismatch")
    assert len(control_plane.reports(5)) == 1


def test_connection_errors_are_retried_then_reported(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ApiClient(f"http://127.0.0.1:{port}", AgentState(tmp_path), retries=2, backoff=0.01)
    with pytest.raises(ApiUnreachable):
        client.me()


def test_a_server_that_comes_up_during_the_retries_is_reached(tmp_path, control_plane):
    state = AgentState(tmp_path)
    state.save_credential({"credential": control_plane.credential})
    control_plane.statuses = [503] * 3
    client = ApiClient(control_plane.url, state, retries=5, backoff=0.01)
    assert client.me()["id"] == control_plane.node_id


def test_a_401_re_reads_the_credential_once(control_plane, tmp_path):
    """Another thread rotated the credential while this request was on its way: one retry
    with the credential stored now succeeds."""
    state = AgentState(tmp_path)
    state.save_credential({"credential": "cpn_old"})
    control_plane.credential = "cpn_new"
    control_plane.on_refused = lambda: state.save_credential({"credential": "cpn_new"})
    client = ApiClient(control_plane.url, state)
    assert client.me()["name"] == "test-node"
    sent = [path for _, path, _ in control_plane.requests]
    assert sent == ["agent/me", "agent/me"]


def test_the_api_root_is_implied(tmp_path):
    assert ApiClient("http://cp:8000", AgentState(tmp_path)).base == "http://cp:8000/api/v1"
    assert ApiClient("http://cp/api/v1/", AgentState(tmp_path)).base == "http://cp/api/v1"
