"""The agent's command line: the enrollment token comes from a file or the environment, never
from the command line (every user of the host reads that in the process list), and one agent
process at a time holds a state dir."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker_agent import cli
from worker_agent.state import AgentState

ROOT = Path(__file__).resolve().parents[2]


def wait_for(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def agent_process(control_plane, state_dir: Path, *args: str, env: dict | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_AGENT_")}
    environ |= {"PYTHONPATH": str(ROOT), "WORKER_AGENT_RUNTIME": "process"} | (env or {})
    command = [sys.executable, "-m", "worker_agent", "--api", control_plane.url]
    command += ["--state-dir", str(state_dir), "--poll-s", "0.2", *args]
    return subprocess.Popen(command, env=environ, stderr=subprocess.PIPE, text=True)


def test_the_token_on_the_command_line_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["--api", "http://x", "--state-dir", "d", "--enroll-token", "t"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --enroll-token" in capsys.readouterr().err


def test_the_token_is_read_from_its_file_else_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("cpe_from_file\n")
    monkeypatch.setenv("WORKER_AGENT_ENROLL_TOKEN", "cpe_from_env")
    assert cli.enrollment_token(str(path)) == "cpe_from_file"  # the file wins
    assert cli.enrollment_token(None) == "cpe_from_env"
    monkeypatch.delenv("WORKER_AGENT_ENROLL_TOKEN")
    assert cli.enrollment_token(None) == ""


def test_a_missing_token_file_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORKER_AGENT_API", "http://127.0.0.1:1")
    monkeypatch.setenv("WORKER_AGENT_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["--enroll-token-file", str(tmp_path / "nowhere")])
    assert exited.value.code == 2 and "--enroll-token-file" in capsys.readouterr().err


def test_an_agent_enrolls_with_the_token_of_its_file_which_its_command_line_never_shows(
    tmp_path, control_plane
):
    token_file = tmp_path / "enroll-token"
    token_file.write_text("cpe_secret_of_the_file\n")
    token_file.chmod(0o600)
    state_dir = tmp_path / "state"
    agent = agent_process(control_plane, state_dir, "--enroll-token-file", str(token_file))
    try:
        wait_for(lambda: control_plane.sent("enroll/"))
        assert control_plane.sent("enroll/")[0]["token"] == "cpe_secret_of_the_file"
        cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes()
        assert b"cpe_secret_of_the_file" not in cmdline
        wait_for(lambda: control_plane.sent("agent/heartbeat"))
        # a second agent on the same state dir exits at once and leaves the credential alone
        second = agent_process(control_plane, state_dir, env={"WORKER_AGENT_ENROLL_TOKEN": "x"})
        assert second.wait(30) == 2
        assert "another agent is running" in second.stderr.read()
        assert AgentState(state_dir).credential() == control_plane.credential
        assert len(control_plane.sent("enroll/")) == 1
        assert agent.poll() is None
        agent.terminate()
        assert agent.wait(15) == 0
    finally:
        agent.kill()
        agent.stderr.close()
    assert not AgentState.in_use(state_dir)  # released with the process


@pytest.mark.docker
def test_an_agent_with_docker_and_no_pause_image_exits_naming_what_to_set(
    tmp_path, control_plane, docker_client
):
    """The test image is no production default: without --pause-image (or its variable) the
    Docker runtime is not offered and the agent does not start, before it enrolls."""
    agent = agent_process(
        control_plane,
        tmp_path / "state",
        env={"WORKER_AGENT_RUNTIME": "docker", "WORKER_AGENT_ENROLL_TOKEN": "cpe_x"},
    )
    try:
        assert agent.wait(30) == 2
        said = agent.stderr.read()
        assert "WORKER_AGENT_PAUSE_IMAGE" in said and "--pause-image" in said
        assert control_plane.sent("enroll/") == []
    finally:
        agent.kill()
        agent.stderr.close()


def test_an_agent_whose_docker_engine_does_not_answer_yet_exits_to_be_restarted(
    tmp_path, control_plane
):
    """`--runtime docker` and no engine behind DOCKER_HOST (dockerd still starting after boot,
    or restarting): exit 1, which the unit restarts (Restart=always), not the configuration
    error's 2 that it would leave down; nothing is enrolled."""
    agent = agent_process(
        control_plane,
        tmp_path / "state",
        env={
            "WORKER_AGENT_RUNTIME": "docker",
            "WORKER_AGENT_ENROLL_TOKEN": "cpe_x",
            "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        },
    )
    try:
        assert agent.wait(30) == 1
        assert "no Docker engine answers" in agent.stderr.read()
        assert control_plane.sent("enroll/") == []
    finally:
        agent.kill()
        agent.stderr.close()
    unit = (ROOT / "deploy/systemd/computepool-agent.service").read_text()
    assert "Restart=always" in unit and "RestartPreventExitStatus=2" in unit
