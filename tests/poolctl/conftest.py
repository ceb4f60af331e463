"""poolctl against a live server: pytest-django's `live_server` (real HTTP on loopback, the test
database, flushed after each test), a person's real API token, and `poolctl.cli.main` called
in-process with its output captured. Jobs are driven the way the product drives them: the
scheduling pass places them, the agent's steps (`jobs.lifecycle.job_report`) run them."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import pytest
from django.db import connection

from jobs.lifecycle import job_report
from jobs.models import Job
from poolctl.cli import main
from pools.actors import Actor
from pools.services import api_token_issue
from scheduling.passes import scheduling_pass


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")  # job outputs


@pytest.fixture
def token(member) -> str:
    return api_token_issue(user=member, name="poolctl")[1]


@pytest.fixture
def poolctl_env(monkeypatch, tmp_path, live_server, token) -> dict:
    """The environment poolctl reads: the live server's URL and the member's token; no config
    file (POOLCTL_CONFIG points at one that does not exist)."""
    env = {
        "POOLCTL_URL": live_server.url,
        "POOLCTL_TOKEN": token,
        "POOLCTL_CONFIG": str(tmp_path / "absent.toml"),
    }
    for name in ("POOLCTL_TENANT", "POOLCTL_POOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def poolctl(poolctl_env, capsys):
    """poolctl("jobs", "--json") → Result(code, out, err)."""

    def run(*args) -> Result:
        capsys.readouterr()
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def place(job_id: int) -> tuple[Job, object]:
    """The scheduling pass places the queued job: it is leased, with a reserved lease."""
    job = Job.objects.get(pk=job_id)
    assert job_id in scheduling_pass(pool_id=job.pool_id).placed
    job.refresh_from_db()
    return job, job.leases.get(state="reserved")


def report(job, lease, step: str, **fields):
    """One step the job's node reports, as its agent does through the agent API."""
    node = lease.node
    return job_report(
        job=job,
        node=node,
        fencing_token=lease.fencing_token,
        step=step,
        actor=Actor.for_node(node),
        **fields,
    )


def run_to(job_id: int, step: str, **fields) -> tuple[Job, object]:
    """Placed, pulled, started, running, then `step` (succeeded or failed)."""
    job, lease = place(job_id)
    for each in ("pulling", "starting", "running"):
        job = report(job, lease, each)
    return report(job, lease, step, **fields), lease


class Driver(threading.Thread):
    """Runs `work` after a short wait in its own thread (and database connection) while poolctl
    follows the job in the test's thread; `join()` re-raises what went wrong."""

    def __init__(self, work, delay: float = 0.5):
        super().__init__(daemon=True)
        self.work, self.delay, self.error = work, delay, None

    def run(self):
        try:
            time.sleep(self.delay)  # poolctl is following by then
            self.work()
        except BaseException as exc:  # re-raised in the test's thread
            self.error = exc
        finally:
            connection.close()

    def join(self, timeout=30):
        super().join(timeout)
        assert not self.is_alive(), "the driver thread did not finish"
        if self.error is not None:
            raise self.error
