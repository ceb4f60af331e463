"""The scheduler health conditions (scheduling/conditions.py) read the same in PromQL and in
Python: the same figures fed to promtool's rule tests and to `evaluate` give the same alerts;
the shipped rules are the conditions' own expressions; the figures are the ones /metrics
exposes; idle-with-backlog over capacity samples."""

import random
import shutil
import subprocess
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from observability.alerts import ALERTS
from scheduling import conditions
from scheduling.conditions import IDLE_WITH_BACKLOG, OLDEST_PENDING, Figures
from tests.conftest import require_service

MAX_WAIT = {"batch": 300, "high": 3600}  # a class without a maximum wait: "none"


def cases() -> list[Figures]:
    fixed = [
        # pool, free / schedulable CPU, queued by reason, oldest by class
        ("lab", 4000, 4000, {"no_capacity": 3}, {"batch": 600, "high": 600}),
        ("quota", 4000, 4000, {"quota_exceeded": 3}, {"batch": 200}),
        ("half", 2000, 4000, {"no_capacity": 2}, {"batch": 300}),  # exactly at both limits
        ("mixed", 3000, 4000, {"quota_exceeded": 2, "not_yet_considered": 1}, {}),
        ("empty", 0, 0, {"no_capacity": 1}, {"none": 99999}),
        ("busy", 1000, 4000, {"no_capacity": 5}, {"high": 3601}),
        ("policy", 4000, 4000, {r: 1 for r in conditions.POLICY_WAITS}, {}),
        ("idle", 4000, 4000, {}, {}),
    ]
    rng = random.Random(22)
    for i in range(12):
        schedulable = rng.choice([0, 1000, 4000, 8000])
        reasons = rng.sample(["no_capacity", "quota_exceeded", "gang_incomplete", "x"], 2)
        fixed.append(
            (
                f"r{i}",
                rng.randint(0, schedulable),
                schedulable,
                {reason: rng.randint(0, 3) for reason in reasons},
                {c: rng.choice([100, 300, 301, 4000]) for c in rng.sample(["batch", "high"], 1)},
            )
        )
    return [
        Figures(
            pool,
            {"free": {"cpu_millicores": free}, "schedulable": {"cpu_millicores": sched}},
            pending,
            oldest,
            MAX_WAIT,
        )
        for pool, free, sched, pending, oldest in fixed
    ]


def series(figures: list[Figures]) -> list[dict]:
    """The figures as /metrics exposes them, constant for 20 minutes; a pool's capacity split
    over two zones (the rule sums a pool's cells)."""
    out = []

    def add(name, labels, value):
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        out.append({"series": f"{name}{{{text}}}", "values": f"{value}x20"})

    for f in figures:
        for kind, by_resource in f.capacity.items():
            amount = by_resource["cpu_millicores"]
            for zone, part in (("z1", amount // 2), ("z2", amount - amount // 2)):
                labels = {"pool": f.pool, "shape_class": "CPU only", "zone": zone}
                add(
                    "computepool_capacity",
                    labels | {"resource": "cpu_millicores", "kind": kind},
                    part,
                )
        for reason, n in f.pending.items():
            add("computepool_pending_jobs", {"pool": f.pool, "reason": reason}, n)
        for cls, age in f.oldest.items():
            add("computepool_oldest_pending_seconds", {"pool": f.pool, "priority_class": cls}, age)
    for cls, seconds in MAX_WAIT.items():
        add("computepool_priority_class_max_wait_seconds", {"priority_class": cls}, seconds)
    return out


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    require_service(path is not None, "promtool (Debian's prometheus package)")
    return path


def test_promql_and_python_agree_on_the_same_figures(promtool, tmp_path):
    figures = cases()
    rules = {
        "groups": [
            {
                "name": "conditions",
                "rules": [
                    {"alert": c.name, "expr": c.promql(), "for": conditions.duration(c.for_s)}
                    for c in (IDLE_WITH_BACKLOG, OLDEST_PENDING)
                ],
            }
        ]
    }
    idle = [{"exp_labels": {"pool": f.pool}} for f in figures if IDLE_WITH_BACKLOG.evaluate(f)]
    late = [
        {"exp_labels": {"pool": hit["pool"], "priority_class": hit["priority_class"]}}
        for f in figures
        for hit in OLDEST_PENDING.evaluate(f)
    ]
    assert idle and late, "the cases must make both conditions hold somewhere"
    assert len(idle) < len(figures) and len(late) < len(figures)
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(figures),
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": IDLE_WITH_BACKLOG.name, "exp_alerts": idle},
                    {"eval_time": "15m", "alertname": OLDEST_PENDING.name, "exp_alerts": late},
                ],
            }
        ],
    }
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run(
        [promtool, "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_shipped_rules_are_the_conditions():
    by_name = {a.name: a for a in ALERTS}
    for condition in (IDLE_WITH_BACKLOG, OLDEST_PENDING):
        alert = by_name[condition.name]
        assert alert.expr == condition.promql()
        assert alert.for_ == conditions.duration(condition.for_s)


def test_idle_with_backlog_over_samples_says_since_when():
    now = timezone.now()
    idle = {"free": {"cpu_millicores": 4000}, "schedulable": {"cpu_millicores": 4000}}
    busy = {"free": {"cpu_millicores": 0}, "schedulable": {"cpu_millicores": 4000}}
    samples = [
        {"at": now - timedelta(minutes=20), "totals": idle, "queued": {"no_capacity": 1}},
        {"at": now - timedelta(minutes=18), "totals": busy, "queued": {"no_capacity": 1}},
        {"at": now - timedelta(minutes=17), "totals": idle, "queued": {"no_capacity": 2}},
        {"at": now - timedelta(minutes=1), "totals": idle, "queued": {"no_capacity": 2}},
    ]
    since = conditions.held_since(samples)
    assert since == now - timedelta(minutes=17)
    assert conditions.firing_for(since, now, IDLE_WITH_BACKLOG)
    samples.append({"at": now, "totals": idle, "queued": {"quota_exceeded": 2}})
    assert conditions.held_since(samples) is None
