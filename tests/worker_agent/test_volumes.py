"""The agent's report of the persistent volumes it holds (worker_agent/volumes.py), against the
stand-in control plane: a node that holds none reports that once, then stays quiet."""

from worker_agent.client import ApiClient
from worker_agent.state import AgentState
from worker_agent.volumes import Volumes


def test_a_node_without_volumes_reports_once_and_then_sends_nothing(tmp_path, control_plane):
    state = AgentState(tmp_path / "state")
    state.save_credential({"credential": control_plane.credential})
    client = ApiClient(control_plane.url, state)
    volumes = Volumes(tmp_path / "work")
    for _ in range(3):
        volumes.reconcile(client)
    assert control_plane.sent("agent/volumes") == [{"volumes": []}]
