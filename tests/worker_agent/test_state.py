"""The state dir keeps the node credential private (0600, written atomically)."""

import os
import stat
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from worker_agent.runtime.base import Owner
from worker_agent.state import AgentState


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_credential_is_written_0600_in_a_0700_dir(tmp_path):
    state = AgentState(tmp_path / "state")
    old = os.umask(0)  # even a permissive umask does not widen it
    try:
        state.save_credential({"credential": "cpn_secret", "credential_prefix": "cpn_secr"})
    finally:
        os.umask(old)
    assert mode(tmp_path / "state") == 0o700
    assert mode(state.dir / "credential") == 0o600
    assert mode(state.dir / "agent.json") == 0o600
    assert state.credential() == "cpn_secret"
    assert "cpn_secret" not in (state.dir / "agent.json").read_text()  # only the prefix there
    assert sorted(p.name for p in state.dir.iterdir()) == ["agent.json", "credential"]


def test_a_rotation_replaces_the_credential_and_is_read_again(tmp_path):
    state = AgentState(tmp_path)
    state.save_credential({"credential": "cpn_one"})
    state.save_node({"id": 7, "name": "gpu-1"})
    state.save_credential({"credential": "cpn_two"})
    assert AgentState(tmp_path).credential() == "cpn_two"  # what a restarted agent reads
    assert AgentState(tmp_path).info()["node_id"] == 7


def test_rotation_is_due_after_half_the_lifetime(tmp_path):
    state = AgentState(tmp_path)
    expires = datetime.now(UTC) + timedelta(days=30)
    state.save_credential({"credential": "cpn_x", "credential_expires_at": expires.isoformat()})
    assert not state.credential_due_for_rotation()
    assert state.credential_due_for_rotation(datetime.now(UTC) + timedelta(days=16))


def test_no_credential_before_enrollment(tmp_path):
    assert AgentState(tmp_path).credential() is None


def test_the_owner_is_the_node_and_control_plane_it_enrolled_with(tmp_path):
    state = AgentState(tmp_path)
    assert state.owner() is None  # not enrolled: nothing is created or found
    plane = str(uuid.uuid4())
    state.save_node({"id": 7, "name": "gpu-1"}, plane)
    assert AgentState(tmp_path).owner() == Owner(plane, 7, "gpu-1")
    state.save_node({"id": 7, "name": "gpu-1"})  # a later `me` without it keeps it
    assert AgentState(tmp_path).owner().control_plane == plane


def test_an_owner_needs_a_real_uuid():
    with pytest.raises(ValueError):
        Owner("../../etc", 1)
