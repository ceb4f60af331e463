"""The Celery app. The beat schedule lives here, in code, so it is reviewed like code."""

import os
import re

import structlog
from celery import Celery, signals
from django.conf import settings

from config.logging import configure_from_settings
from config.request_id import REQUEST_ID
from pools import logcontext

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("computepool")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Sweeps take `now` themselves and use guarded updates, so running them on several beat
# schedulers or workers at once is safe (a second run finds 0 rows to change).
app.conf.beat_schedule = {
    # Proves to /healthz that beat schedules and a worker runs (config/tasks.py).
    "health-beat": {"task": "config.health_beat", "schedule": 5.0},
    # A pass that could not start within its period is dropped (`expires`), not run late: by
    # then the next one is due, and it reads the queue afresh. So passes never pile up behind a
    # slow or stopped worker (each would plan the same jobs on a stale view). How long one may
    # run: scheduling/tasks.py.
    "scheduling-pass": {
        "task": "scheduling.pass",
        "schedule": settings.SCHEDULER_PASS_PERIOD_S,
        "options": {"expires": settings.SCHEDULER_PASS_PERIOD_S},
    },
    "scheduling-requeue-stranded-jobs": {
        "task": "scheduling.requeue_stranded_jobs",
        "schedule": 10.0,
    },
    "scheduling-drain-sweep": {"task": "scheduling.drain_sweep", "schedule": 30.0},
    # backfilled jobs reclaimed before their reservation's window opens (scheduling/backfill.py)
    "scheduling-reclaim-backfills": {"task": "scheduling.reclaim_backfills", "schedule": 5.0},
    # checkpoints asked for (drain, preemption) the agent never reported (scheduling/drain.py)
    "scheduling-checkpoint-deadline": {
        "task": "scheduling.checkpoint_deadline_sweep",
        "schedule": 60.0,
    },
    # queued jobs' queue class and predicted start window (scheduling/forecast.py)
    "scheduling-forecast": {"task": "scheduling.forecast_refresh", "schedule": 30.0},
    # idle MIG GPUs asked for the layouts waiting jobs need, in pools that allow it
    # (scheduling/mig_plan.py; knob mig_reconfiguration, off by default; unverified on hardware)
    "scheduling-mig-layout-plan": {"task": "scheduling.mig_layout_plan", "schedule": 30.0},
    # pool capacity sampled for the operators' utilisation charts (scheduling/health.py)
    "scheduling-sample-capacity": {"task": "scheduling.sample_capacity", "schedule": 60.0},
    # … and rolled up by the hour (with the pass records) for the 7-day charts
    "scheduling-roll-up-health": {"task": "scheduling.roll_up_health", "schedule": 300.0},
    "pools-purge-api-tokens": {"task": "pools.purge_api_tokens", "schedule": 3600.0},
    # operators' support grants past their expiry: the event (reads refuse them at once)
    "pools-expire-support-grants": {"task": "pools.expire_support_grants", "schedule": 60.0},
    "nodes-heartbeat-sweep": {"task": "nodes.heartbeat_sweep", "schedule": 10.0},
    "nodes-inventory-reconcile": {"task": "nodes.inventory_reconcile_sweep", "schedule": 60.0},
    "leases-expire": {"task": "leases.expire_leases", "schedule": 5.0},
    "leases-uncertain-deadline": {"task": "leases.expire_uncertain", "schedule": 30.0},
    # ended jobs' outputs and logs past their pool's output_retention_days (jobs/artifacts.py)
    "jobs-expire-artifacts": {"task": "jobs.expire_artifacts", "schedule": 86400.0},
    # persistent volumes detached past their retention (storage/tasks.py)
    "storage-expire-volumes": {"task": "storage.expire_volumes", "schedule": 3600.0},
    # tenants' credit accounts charged for their leases since the last charge (leases/tasks.py)
    "leases-charge-credits": {"task": "leases.charge_credits", "schedule": 300.0},
    # the event log folded into the metrics' counters and histograms (observability/fold.py)
    "observability-fold": {
        "task": "observability.fold",
        "schedule": settings.METRICS_FOLD_PERIOD_S,
        "options": {"expires": settings.METRICS_FOLD_PERIOD_S},
    },
    "reservations-unclaimed": {
        "task": "leases.release_unclaimed_reservations",
        "schedule": 15.0,
    },
}


# Log lines (docs/observability.md, "Logs"). The worker's lines go through settings.LOGGING's
# formatter like the web server's: a `setup_logging` receiver means Celery leaves logging alone
# (no hijacked root logger, no colours, no redirected stdout) and settings.LOGGING is applied
# again, at the worker's --loglevel. A task carries the request id (and the trace id) of the
# request that enqueued it in its message headers; while it runs they are bound again, with the
# task's id and name, and reset when it ends.
LOG_HEADERS = {
    "request_id": (logcontext.request_id, REQUEST_ID),
    "trace_id": (logcontext.trace_id, re.compile(r"[0-9a-f]{32}")),
}


@signals.setup_logging.connect
def _setup_logging(loglevel=None, **_):
    configure_from_settings(loglevel)


@signals.before_task_publish.connect
def _carry_log_context(headers=None, **_):
    if headers is None:
        return
    for name, (var, _pattern) in LOG_HEADERS.items():
        value = var.get()
        if value:
            headers.setdefault(name, value)


@signals.task_prerun.connect
def _bind_log_context(task_id=None, task=None, **_):
    if task is None:
        return
    request = task.request
    tokens = []
    for name, (var, pattern) in LOG_HEADERS.items():
        value = getattr(request, name, None)  # a header of the message; an eager task has none
        if isinstance(value, str) and pattern.fullmatch(value):
            tokens.append((var, var.set(value)))
    bound = structlog.contextvars.bind_contextvars(task_id=task_id, task_name=task.name)
    request._log_context_tokens = (tokens, bound)


@signals.task_postrun.connect
def _reset_log_context(task=None, **_):
    saved = getattr(getattr(task, "request", None), "_log_context_tokens", None)
    if saved is None:
        return
    tokens, bound = saved
    structlog.contextvars.reset_contextvars(**bound)
    for var, token in reversed(tokens):
        var.reset(token)
    del task.request._log_context_tokens
