"""deploy/: the systemd units pass `systemd-analyze verify`, and they, the Procfile and the
environment examples start the role each is named for with every setting that role needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from config.roles import REQUIRED_SETTINGS, missing_settings

DEPLOY = settings.BASE_DIR / "deploy"
UNITS = {
    "web": "computepool-web@.service",
    "worker": "computepool-worker@.service",
    "beat": "computepool-beat.service",
    "agent": "computepool-agent.service",
}
# where the shipped units expect the product (docs/deployment.md, "Installing")
INSTALLED = {
    "/opt/computepool-agent/bin/python": sys.executable,
    "/opt/computepool/.venv/bin/python": sys.executable,
    "/opt/computepool": str(settings.BASE_DIR),
}


def render(unit: str, directory: Path) -> Path:
    """The unit with this checkout in place of the install prefix (verify fails on an
    ExecStart binary that does not exist), a template as its instance 8001."""
    text = (DEPLOY / "systemd" / unit).read_text()
    for prefix, here in INSTALLED.items():
        text = text.replace(prefix, here)
    path = directory / unit.replace("@.", "@8001.")
    path.write_text(text)
    return path


def exec_start(unit: str) -> str:
    (line,) = re.findall(r"^ExecStart=(.*)$", (DEPLOY / "systemd" / unit).read_text(), re.M)
    return line


def test_every_unit_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("systemd-analyze is required in CI")
        pytest.skip("systemd-analyze is not installed")
    paths = [render(unit, tmp_path) for unit in UNITS.values()]
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True, timeout=60
    )
    # no warning either: an unknown or misspelt directive is only a warning
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_a_unit_that_names_a_missing_binary_fails_verify(tmp_path):
    """The check above can fail: the shipped paths do not exist on this machine."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    shipped = tmp_path / "computepool-beat.service"
    shutil.copy(DEPLOY / "systemd" / "computepool-beat.service", shipped)
    done = subprocess.run(["systemd-analyze", "verify", str(shipped)], capture_output=True)
    assert done.returncode != 0 and b"/opt/computepool/.venv/bin/python" in done.stderr


def test_each_unit_runs_its_role_from_the_installed_tree():
    assert exec_start(UNITS["web"]).endswith("manage.py role web --bind ${WEB_HOST}:%i")
    assert " role worker --hostname worker-%i@%H " in exec_start(UNITS["worker"])
    assert " role beat --schedule /var/lib/computepool/beat-schedule" in exec_start(UNITS["beat"])
    assert exec_start(UNITS["agent"]) == "/opt/computepool-agent/bin/python -m worker_agent"
    for unit in UNITS.values():
        assert exec_start(unit).startswith("/opt/computepool")  # the shipped paths, not ours
        assert "NoNewPrivileges=yes" in (DEPLOY / "systemd" / unit).read_text()


def environment_file(path: Path) -> dict:
    """NAME=value lines, as systemd's EnvironmentFile reads them (comments skipped)."""
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_the_environment_example_has_every_setting_of_every_control_plane_role():
    env = environment_file(DEPLOY / "computepool.env.example")
    for role in ("web", "worker", "beat"):
        assert missing_settings(role, env) == [], role


def test_the_agent_environment_example_names_the_api_and_its_ca():
    env = environment_file(DEPLOY / "agent.env.example")
    unit = (DEPLOY / "systemd" / UNITS["agent"]).read_text()
    env["WORKER_AGENT_STATE_DIR"] = re.search(r"WORKER_AGENT_STATE_DIR=(\S+)", unit).group(1)
    assert set(REQUIRED_SETTINGS["agent"]) <= set(env)
    assert env["WORKER_AGENT_CA_FILE"].endswith(".pem")


def test_the_procfile_runs_every_role():
    lines = (DEPLOY / "Procfile").read_text().splitlines()
    entries = dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))
    assert entries == {
        "web": "python manage.py role web --bind 0.0.0.0:${PORT:-8000}",
        "worker": "python manage.py role worker",
        "beat": "python manage.py role beat",
        "agent": "python -m worker_agent",
    }
