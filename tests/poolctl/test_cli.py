"""The command line's contract with a shell: exit codes 0 ok, 1 usage/config, 2 refused by the
API, 3 server or network; the installed `poolctl` script; clear messages on stderr."""

import socket
import subprocess
import sys
from pathlib import Path

from config.builders import submit_job
from poolctl.cli import main
from tests.conftest import require_service


def test_version_and_help_exit_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("poolctl 0.")
    assert main(["leases", "reserve", "--help"]) == 0
    assert "--fencing-token" not in capsys.readouterr().out


def test_a_usage_error_exits_1_before_anything_is_sent(capsys):
    assert main(["jobs", "not-a-number"]) == 1
    assert "invalid int value: 'not-a-number'" in capsys.readouterr().err
    assert main(["leases", "commit", "5"]) == 1  # no --fencing-token
    assert "--fencing-token" in capsys.readouterr().err
    assert main([]) == 1


def test_a_missing_token_exits_1_naming_where_to_set_it(poolctl, monkeypatch):
    monkeypatch.delenv("POOLCTL_TOKEN")
    result = poolctl("jobs")
    assert result.code == 1
    assert "no token: set POOLCTL_TOKEN" in result.err and "absent.toml" in result.err


def test_a_wrong_token_is_refused_with_exit_2(poolctl, monkeypatch):
    monkeypatch.setenv("POOLCTL_TOKEN", "cpu_not-a-real-token")
    result = poolctl("jobs")
    assert result.code == 2
    assert "refused (401 authentication_failed)" in result.err
    assert "Check POOLCTL_TOKEN" in result.err


def test_a_dead_server_exits_3(poolctl, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("POOLCTL_URL", f"http://127.0.0.1:{port}")
    result = poolctl("jobs")
    assert result.code == 3
    assert f"cannot reach http://127.0.0.1:{port}" in result.err
    assert "Connection refused" in result.err


def test_a_url_that_is_not_the_apis_root_says_so(poolctl, monkeypatch, live_server):
    monkeypatch.setenv("POOLCTL_URL", f"{live_server.url}/accounts")  # Django's HTML 404 page
    result = poolctl("pools")
    assert result.code == 2
    assert result.err.startswith("poolctl: refused (404 http_404): Not Found, and not in the")
    assert "is POOLCTL_URL right?" in result.err


def test_the_installed_script_speaks_to_the_live_server(poolctl_env, pool, tenant):
    script = Path(sys.executable).parent / "poolctl"
    require_service(script.exists(), "the poolctl script (`pip install -e .`, make's venv step)")
    job = submit_job(pool, tenant, name="scripted")
    env = {"PATH": str(script.parent), **poolctl_env}
    listed = subprocess.run(
        [str(script), "jobs", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert '"name": "scripted"' in listed.stdout and f'"id": {job.pk}' in listed.stdout
    refused = subprocess.run(
        [str(script), "cancel", str(job.pk + 1000)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "404 not_found" in refused.stderr
