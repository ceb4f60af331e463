"""The alert rules that ship in deploy/prometheus/ (observability/alerts.py): the file is the
module's rendering, promtool accepts it, its unit tests pass, and every series an alert reads
is one /metrics exposes."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from observability import catalogue
from observability.alerts import ALERTS, render
from tests.conftest import require_service

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    require_service(path is not None, "promtool (Debian's prometheus package)")
    return path


def run(*command, cwd=DEPLOY):
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_shipped_rules_are_the_module_s_rendering():
    assert (DEPLOY / "alerts.yml").read_text() == render(), "run manage.py render_alerts"


def test_promtool_accepts_the_rules_and_their_unit_tests_pass(promtool):
    checked = run(promtool, "check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    tested = run(promtool, "test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    tests = (DEPLOY / "alerts.test.yml").read_text()
    for alert in ALERTS:
        assert f"alertname: {alert.name}" in tests, alert.name


def test_the_scrape_configuration_is_valid(promtool, tmp_path):
    token = tmp_path / "token"
    token.write_text("cpu_example\n")
    config = (DEPLOY / "prometheus.yml").read_text()
    config = config.replace("/etc/prometheus/computepool-scrape-token", str(token))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    checked = run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_alerts_read_only_series_the_metrics_endpoint_exposes():
    exposed = {catalogue.PREFIX + name for name in catalogue.GAUGES}
    for metric in catalogue.FOLDED:
        suffixes = ("_total",) if metric.kind == "counter" else ("_bucket", "_sum", "_count")
        exposed |= {metric.full_name + suffix for suffix in suffixes}
    for alert in ALERTS:
        read = set(re.findall(r"computepool_[a-z_]+", alert.expr))
        assert read <= exposed, (alert.name, read - exposed)
