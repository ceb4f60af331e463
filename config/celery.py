"""The Celery app. The beat schedule lives here, in code, so it is reviewed like code; and the
leader lock that keeps a second beat from doubling it (LeaderScheduler)."""

import contextlib
import logging
import os
import re
import socket
import uuid

import redis
import structlog
from celery import Celery, signals
from celery.beat import PersistentScheduler
from django.conf import settings
from kombu.transport import redis as kombu_redis

from config.logging import configure_from_settings
from config.request_id import REQUEST_ID
from config.roles import beat_lock_timeout
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


# --- a worker that outlives a broker restart -----------------------------------------------
# kombu 5.7.0: when the broker connection drops while this worker holds unacknowledged messages,
# the consumer's error path can close the transport (its `client` becomes None) before the
# channel, whose close then restores those messages through that client: AttributeError, which
# kombu's `ignore_errors` does not catch, and the worker exits ("Unrecoverable error"; the
# drill's Redis restart found it, docs/reliability.md). The messages are in Redis's unacked set
# either way, and kombu puts them back on the queue after its visibility timeout; so a restore
# that finds the transport already closed leaves them there, and the worker reconnects.
log_worker = logging.getLogger("config.worker")
_restore_unacked = kombu_redis.QoS.restore_unacked


def restore_unacked_unless_closed(qos, client=None):
    transport = qos.channel.connection
    if client is None and (transport is None or transport.client is None):
        log_worker.warning(
            "broker connection closed with %d message(s) unacknowledged: left to the "
            "broker's visibility timeout",
            len(qos._delivered),
        )
        return None
    return _restore_unacked(qos, client)


kombu_redis.QoS.restore_unacked = restore_unacked_unless_closed

# --- beat's leader lock -------------------------------------------------------------------
# Exactly one beat should run (docs/deployment.md). One started by mistake beside it, or a
# restarted one while the old one still runs, must not double the schedule: each beat takes a
# lock in Redis, renewed while it runs, and only its holder sends tasks; the others stand by and
# take over once the holder stops (it releases the lock) or dies (the lock expires after
# BEAT_LOCK_TIMEOUT_S). Should two ever send at once (a holder frozen past its lock), the tasks
# stay safe: sweeps are guarded updates, and passes run one per pool at a time under the pool's
# PostgreSQL advisory lock (scheduling/coalesce.py).
# Not celery-redbeat: its beat exits when Redis restarts (its lock renewal is not retried);
# this one keeps running and stands by until Redis answers again.
log = logging.getLogger("config.beat")

# The holder renews the lock (to the full timeout) when it holds it; otherwise takes it if free.
# Returns 1 when this beat holds it now, else who does.
HOLD_SCRIPT = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
if not holder then
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return holder
"""
RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def beat_lock_key() -> str:
    """One lock per deployment (settings.DEPLOYMENT_PREFIX): two on one Redis never share it."""
    return f"computepool:beat-leader:{settings.DEPLOYMENT_PREFIX}"


class LeaderScheduler(PersistentScheduler):
    """Celery's file scheduler (the --schedule file keeps the last run times) that sends only
    while it holds the deployment's beat lock."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock_timeout = beat_lock_timeout()
        # every tick (at least each second) checks the lock still names this beat before it
        # sends: one that lost it (expired while frozen, or gone with a Redis restarted empty
        # and taken by a standby) stops sending within a second
        self.max_interval = min(self.max_interval, 1.0)
        self.lock_key = beat_lock_key()
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.redis = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2
        )
        self.hold_script = self.redis.register_script(HOLD_SCRIPT)
        self.release_script = self.redis.register_script(RELEASE_SCRIPT)
        self.leading, self.said = False, ""

    def tick(self, *args, **kwargs):
        self.leading = self.hold()  # renewed to the full timeout on each tick
        if not self.leading:
            return 1.0  # a standby looks again every second
        return super().tick(*args, **kwargs)

    def hold(self) -> bool:
        """Takes or renews the lock; False (standing by) when another holds it or Redis does
        not answer (without Redis no task could be sent anyway)."""
        try:
            answer = self.hold_script(keys=[self.lock_key], args=[self.token, self.lock_ms])
        except redis.RedisError as exc:
            self.say(f"beat: Redis does not answer ({exc}): sending nothing until it does")
            return False
        if answer == 1:
            self.say(f"beat: leading: holds the lock {self.lock_key} as {self.token}")
            return True
        holder = answer.decode() if isinstance(answer, bytes) else answer
        self.say(
            f"beat: standing by: {holder} holds the lock {self.lock_key}; this beat takes over "
            f"when it stops, or {self.lock_timeout:g} s after it died"
        )
        return False

    @property
    def lock_ms(self) -> int:
        return int(self.lock_timeout * 1000)

    def say(self, line: str) -> None:
        """Each change of state once (a standby looks every second)."""
        if line != self.said:
            log.log(logging.WARNING if "Redis" in line else logging.INFO, line)
            self.said = line

    def close(self):
        """A clean stop hands the lead over at once."""
        if self.leading:
            with contextlib.suppress(redis.RedisError):  # else it expires on its own
                self.release_script(keys=[self.lock_key], args=[self.token])
            self.leading = False
        super().close()


app.conf.beat_scheduler = "config.celery:LeaderScheduler"


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
