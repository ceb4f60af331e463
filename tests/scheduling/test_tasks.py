"""The control loop's beat tasks run with the current time (eager Celery in tests)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM
from config.celery import app
from nodes import services
from nodes.models import Node
from scheduling import tasks

pytestmark = pytest.mark.django_db


def test_beat_schedule_names_registered_tasks():
    schedule = app.conf.beat_schedule
    names = {entry["task"] for key, entry in schedule.items() if key.startswith("scheduling-")}
    assert names == {
        "scheduling.pass",
        "scheduling.requeue_stranded_jobs",
        "scheduling.drain_sweep",
        "scheduling.checkpoint_deadline_sweep",
        "scheduling.forecast_refresh",
        "scheduling.sample_capacity",
        "scheduling.roll_up_health",
        "scheduling.reclaim_backfills",
        "scheduling.mig_layout_plan",
    }
    assert names <= set(app.tasks)


def test_drain_sweep_task(ready_node, make_job):
    now = timezone.now()
    make_job(ready_node.node, checkpointable=True)
    services.node_drain(
        node=ready_node.node, actor=SYSTEM, deadline=now + timedelta(milliseconds=1), now=now
    )
    Node.objects.filter(pk=ready_node.node.pk).update(drain_deadline=now - timedelta(seconds=1))
    result = tasks.drain_sweep.delay().get()
    assert result["enforced"] == [ready_node.node.pk]


def test_a_pass_not_started_within_its_period_is_dropped_and_a_hung_one_stopped(settings):
    period = settings.SCHEDULER_PASS_PERIOD_S
    entry = app.conf.beat_schedule["scheduling-pass"]
    assert entry["schedule"] == period
    assert entry["options"] == {"expires": period}  # beat sends it to expire one period later
    # the worker kills a pass past 30 periods, whoever sent it; no soft limit (the pass would
    # catch its exception and go on one job at a time)
    assert tasks.scheduling_pass.time_limit == 30 * period == 60
    assert tasks.scheduling_pass.soft_time_limit is None


def test_reclaim_backfills_task_runs_and_answers_the_jobs_it_moved(db):
    from scheduling.tasks import reclaim_backfills

    assert reclaim_backfills(now=timezone.now().isoformat()) == []
