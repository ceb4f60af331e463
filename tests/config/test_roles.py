"""The fleet's role entry points (config/roles.py, `manage.py role`), run as real processes against
the test database and a redis-server of this module's own (a worker here must never take the
tasks of other tests' processes): each refuses to start without its settings, starts, and stops
cleanly on SIGTERM; two beats never both send the schedule; an agent trusts the API's TLS
certificate only through its --ca-file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from config.demo import agent_enrollment_token
from config.drill.tls import make_certificates
from config.management.commands import runstack
from config.roles import REQUIRED_SETTINGS
from nodes.models import Node
from tests.process_output import read_output

MANAGE = str(settings.BASE_DIR / "manage.py")
KEYS = "test-1=dGVzdC1rZXktb25lLXRlc3Qta2V5LW9uZS10ZXN0LWs="


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(port: int, directory: Path) -> subprocess.Popen:
    """A redis-server on `port` (no persistence), once it answers."""
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    process = subprocess.Popen([*command, "--dir", str(directory)], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server of this module's own, on a free port."""
    port = _free_port()
    process = start_redis(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    process.terminate()
    process.wait(10)


def bare_environment() -> dict:
    """What a fresh machine gives a process: none of the product's settings."""
    keep = ("PATH", "HOME", "LANG", "VIRTUAL_ENV")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    return env | {"DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def role_env(django_db_setup, redis_url, tmp_path):
    """Every setting any role needs: the test database, this module's Redis."""
    db = connection.settings_dict
    user = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return bare_environment() | {
        "SECRET_KEY": "test-roles-secret-key",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": f"postgres://{user}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": redis_url,
        "ENCRYPTION_KEYS": KEYS,
        "MEDIA_ROOT": str(tmp_path / "media"),
        "CHANNEL_LAYER_PREFIX": f"test-roles-{os.getpid()}",
        "LOG_FORMAT": "json",
    }


class Process:
    """A process whose output goes to a file (never a pipe a full buffer would stall)."""

    def __init__(self, command, env):
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process, in kill()
        self.popen = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)

    def output(self) -> str:
        return read_output(self.log)

    def wait_for(self, text: str, timeout: float = 60, count: int = 1) -> None:
        """Until `text` appeared `count` times in its output."""
        deadline = time.monotonic() + timeout
        while self.output().count(text) < count:
            if self.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {text!r} (exit {self.popen.poll()}): {self.output()[-3000:]}")
            time.sleep(0.2)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit status (SIGKILL and a failure if it does not stop)."""
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"it did not stop within {timeout} s of SIGTERM: {self.output()[-3000:]}")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def close(self) -> None:
        self.kill()
        self.log.close()

    def command_line(self) -> str:
        return Path(f"/proc/{self.popen.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@contextmanager
def role(*args, env):
    process = Process([sys.executable, MANAGE, "role", *args], env)
    try:
        yield process
    finally:
        process.close()


def refusal(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, MANAGE, "role", *args], env=env, capture_output=True, text=True, timeout=60
    )


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["web", "worker", "beat"])
def test_a_role_refuses_to_start_without_its_settings_naming_them_all(name):
    done = refusal(name, env=bare_environment())
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one clear line, no traceback
    for setting in REQUIRED_SETTINGS[name]:
        assert setting in lines[0]
    assert "docs/deployment.md" in lines[0]


def test_an_empty_setting_is_missing_and_only_the_missing_ones_are_named(role_env):
    env = role_env | {"REDIS_URL": ""}
    del env["SECRET_KEY"]
    done = refusal("web", "--bind", "127.0.0.1:1", env=env)
    assert done.returncode == 2
    assert "set SECRET_KEY, REDIS_URL in its environment" in done.stderr
    assert "DATABASE_URL" not in done.stderr


def test_the_alternatives_of_a_setting_count_as_set(role_env, tmp_path):
    """The key ring from a file, outputs in the object store: no ENCRYPTION_KEYS, no MEDIA_ROOT."""
    (tmp_path / "keys").write_text(KEYS)
    env = role_env | {"ENCRYPTION_KEYS_FILE": str(tmp_path / "keys")}
    env |= {"OUTPUTS_TO_OBJECT_STORE": "y", "REDIS_URL": ""}  # django-environ's true
    del env["ENCRYPTION_KEYS"], env["MEDIA_ROOT"]
    done = refusal("worker", env=env)
    assert done.returncode == 2
    assert "set REDIS_URL in its environment" in done.stderr  # and nothing else


def test_bad_flags_are_refused_with_a_clear_line(role_env, tmp_path):
    for args, said in [
        (["web", "--bind", "8000"], "--bind '8000': expected HOST:PORT"),
        (["web", "--certfile", str(tmp_path / "c.pem")], "both --certfile and --keyfile"),
        (["worker", "--concurrency", "0"], "--concurrency must be at least 1"),
        (["beat", "--schedule", str(tmp_path / "no" / "s")], "no such directory"),
        (["beat", "--schedule", str(tmp_path)], "a directory, not a file"),
        (["web", "--bind", "127.0.0.1:99999"], "a port is 1 to 65535"),
        (["web", "--bind", "127.0.0.1:８０"], "expected HOST:PORT"),
        (["web", "--certfile", str(tmp_path), "--keyfile", str(tmp_path)], "not a readable"),
    ]:
        done = refusal(*args, env=role_env)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_settings_that_are_set_but_cannot_work_are_refused_before_the_server_starts(
    role_env, tmp_path
):
    """Else the server fails on its own, and its supervisor restarts it again and again."""
    for role_, env, said in [
        ("beat", {"BEAT_LOCK_TIMEOUT_S": "abc"}, "BEAT_LOCK_TIMEOUT_S='abc': expected seconds"),
        ("beat", {"BEAT_LOCK_TIMEOUT_S": "nan"}, "between 3 and 3600"),
        ("beat", {"BEAT_LOCK_TIMEOUT_S": "0"}, "between 3 and 3600"),
        (
            "worker",
            {"ENCRYPTION_KEYS": "", "ENCRYPTION_KEYS_FILE": str(tmp_path / "typo")},
            f"ENCRYPTION_KEYS_FILE={tmp_path / 'typo'}: not a readable file",
        ),
    ]:
        done = refusal(role_, env=role_env | env)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_an_ipv6_address_binds_bracketed_or_not(role_env):
    """WEB_HOST=:: in the unit makes `--bind :::8001`."""
    port = _free_port()
    with role("web", "--bind", f":::{port}", env=role_env) as web:
        _wait_for_answer(f"http://[::1]:{port}/healthz", web)
        assert f"[::]:{port}" in web.command_line()  # hypercorn's, once exec'd
        assert web.terminate() == 0


# --- each role: starts, stops on SIGTERM ---------------------------------------------------


def test_the_web_role_serves_and_stops_on_sigterm(role_env):
    port = _free_port()
    with role("web", "--bind", f"127.0.0.1:{port}", env=role_env) as web:
        answer = _wait_for_answer(f"http://127.0.0.1:{port}/healthz", web)
        assert set(json.loads(answer)) >= {"status", "database", "redis"}
        # the supervisor's process is the server itself (execv): its SIGTERM reaches it
        assert "hypercorn" in web.command_line()
        assert web.terminate() == 0


def test_the_worker_role_gets_ready_without_beat_and_stops_on_sigterm(role_env):
    with role("worker", "--concurrency", "1", "--hostname", "roles@test", env=role_env) as worker:
        worker.wait_for("roles@test ready")
        assert "celery" in worker.command_line() and "--beat" not in worker.command_line()
        assert worker.terminate() == 0
        assert "beat: Starting" not in worker.output()


def test_one_beat_sends_the_schedule_a_second_stands_by_and_takes_over(role_env, tmp_path):
    """Two beats of one deployment: only the lock's holder sends; killed, the other takes over
    within the lock's timeout; a clean stop releases the lock."""
    env = role_env | {"BEAT_LOCK_TIMEOUT_S": "4"}
    client = redis.Redis.from_url(env["REDIS_URL"])
    client.delete(f"{env['CHANNEL_LAYER_PREFIX']}:celery")  # the deployment's default queue
    lock = f"computepool:beat-leader:{env['CHANNEL_LAYER_PREFIX']}"
    with (
        role("beat", "--schedule", str(tmp_path / "a"), env=env) as a,
        role("beat", "--schedule", str(tmp_path / "b"), env=env) as b,
    ):
        # whichever takes the lock first (under load the second started may)
        deadline = time.monotonic() + 60
        while "beat: leading" not in a.output() + b.output():
            assert time.monotonic() < deadline, a.output()[-2000:] + b.output()[-2000:]
            time.sleep(0.2)
        first, second = (a, b) if "beat: leading" in a.output() else (b, a)
        second.wait_for("beat: standing by")
        assert client.get(lock).decode().split(":")[1] == str(first.popen.pid)
        queue = f"{env['CHANNEL_LAYER_PREFIX']}:celery"
        before = _sent(client, queue, "config.health_beat")
        time.sleep(11)  # health-beat is due every 5 s: two or three sends, six if doubled
        assert 2 <= _sent(client, queue, "config.health_beat") - before <= 3
        assert "Sending due task" not in second.output()

        first.kill()  # SIGKILL: its lock stays until it expires
        killed_at = time.monotonic()
        second.wait_for("beat: leading", timeout=15)
        # the timeout, a look a second, and slack for a loaded machine (the default is 30)
        assert time.monotonic() - killed_at <= 4 + 4
        second.wait_for("Sending due task health-beat")
        assert second.terminate() == 0
    assert client.get(lock) is None  # released on the clean stop


def test_a_leading_beat_that_finds_its_lock_taken_stops_sending_within_a_second(role_env, tmp_path):
    """Redis restarted empty and a standby took the lock first: the old leader must not send
    on until its next renewal (it checks on every tick)."""
    env = role_env | {"BEAT_LOCK_TIMEOUT_S": "30", "CHANNEL_LAYER_PREFIX": f"steal-{os.getpid()}"}
    client = redis.Redis.from_url(env["REDIS_URL"])
    lock = f"computepool:beat-leader:{env['CHANNEL_LAYER_PREFIX']}"
    with role("beat", "--schedule", str(tmp_path / "s"), env=env) as beat:
        beat.wait_for("Sending due task health-beat")
        client.set(lock, "elsewhere:1:standby", px=60_000)
        taken_at = time.monotonic()
        beat.wait_for("beat: standing by: elsewhere:1:standby holds the lock", timeout=10)
        assert time.monotonic() - taken_at < 3
        sends = beat.output().count("Sending due task")
        time.sleep(6)  # health-beat (5 s) and the pass (2 s) fell due meanwhile
        assert beat.output().count("Sending due task") == sends
        client.delete(lock)
        beat.wait_for("beat: leading", timeout=10, count=2)
        assert beat.terminate() == 0


def test_beat_outlives_a_redis_restart_and_leads_again(role_env, tmp_path):
    """Without Redis beat sends nothing and says so; it keeps running and leads again once
    Redis answers (celery-redbeat's beat exits there instead)."""
    port = _free_port()
    server = start_redis(port, tmp_path)
    env = role_env | {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "BEAT_LOCK_TIMEOUT_S": "3"}
    try:
        with role("beat", "--schedule", str(tmp_path / "s"), env=env) as beat:
            beat.wait_for("beat: leading")
            server.terminate()
            server.wait(10)
            beat.wait_for("beat: Redis does not answer", timeout=15)
            server = start_redis(port, tmp_path)
            beat.wait_for("sending nothing until it does")
            lead_again = beat.output().count("beat: leading") + 1
            deadline = time.monotonic() + 15
            while beat.output().count("beat: leading") < lead_again:
                assert beat.popen.poll() is None, beat.output()[-3000:]
                assert time.monotonic() < deadline, beat.output()[-3000:]
                time.sleep(0.2)
            assert beat.terminate() == 0
    finally:
        server.terminate()
        server.wait(10)


def _sent(client, queue: str, task: str) -> int:
    """The messages of `task` waiting in `queue` (no worker consumes it here)."""
    return sum(json.loads(m)["headers"]["task"] == task for m in client.lrange(queue, 0, -1))


def _wait_for_answer(url: str, process: Process, context=None) -> str:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as answer:
                return answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.read().decode()  # it answers (503 while a part is unhealthy)
        except OSError:
            if process.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not answer: {process.output()[-3000:]}")
            time.sleep(0.3)


# --- TLS between the agents and the API ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_agent_trusts_the_apis_certificate_only_with_its_ca_file(role_env, tmp_path):
    call_command("load_demo", verbosity=0)
    tls = make_certificates(tmp_path / "tls", ["127.0.0.1"])
    port = _free_port()
    api = f"https://127.0.0.1:{port}"
    web_args = ["web", "--bind", f"127.0.0.1:{port}"]
    web_args += ["--certfile", str(tls.cert_file), "--keyfile", str(tls.key_file)]
    with role(*web_args, env=role_env) as web:
        _wait_for_answer(f"{api}/healthz", web, context=_trusting(tls.ca_file))
        agent_env = bare_environment() | {
            "WORKER_AGENT_ENROLL_TOKEN": agent_enrollment_token("dev"),
            "WORKER_AGENT_LOG_FORMAT": "console",
        }

        def agent(name, *extra):
            state = tmp_path / name
            command = [sys.executable, "-m", "worker_agent", "--api", api, "--pool", "dev"]
            command += ["--state-dir", str(state), "--node-name", name, "--runtime", "process"]
            return Process([*command, *extra], agent_env)

        untrusting = agent("no-ca")
        assert untrusting.popen.wait(60) == 1
        said = untrusting.output()
        assert "the API's TLS certificate is not trusted" in said
        assert "give the CA that signed it with --ca-file or WORKER_AGENT_CA_FILE" in said
        assert "retry" not in said  # refused at once, not retried as a network fault
        assert not Node.objects.filter(name="no-ca").exists()

        trusting = agent("with-ca", "--ca-file", str(tls.ca_file))
        try:
            deadline = time.monotonic() + 60
            while not Node.objects.filter(name="with-ca", pool__slug="dev").exists():
                assert trusting.popen.poll() is None, trusting.output()[-3000:]
                assert time.monotonic() < deadline, trusting.output()[-3000:]
                time.sleep(0.5)
            assert trusting.terminate() == 0
        finally:
            trusting.kill()
        assert web.terminate() == 0


def test_an_unreadable_ca_file_is_refused_at_start(tmp_path):
    command = [sys.executable, "-m", "worker_agent", "--api", "https://127.0.0.1:1"]
    command += ["--state-dir", str(tmp_path / "s"), "--ca-file", str(tmp_path / "none.pem")]
    done = subprocess.run(command, env=bare_environment(), capture_output=True, text=True)
    assert done.returncode == 2
    assert f"--ca-file {tmp_path / 'none.pem'}: not a readable file" in done.stderr


def _trusting(ca_file: Path):
    import ssl

    return ssl.create_default_context(cafile=str(ca_file))


# --- make run builds its processes with the same code -------------------------------------


def test_make_run_starts_the_web_role_and_a_worker_with_beat_inside(tmp_path):
    web = runstack.web_command("::1", 8000)
    assert web[-3:] == ["--bind", "[::1]:8000", "config.asgi:application"]
    worker = runstack.worker_command(tmp_path / "schedule")
    assert worker[worker.index("--beat") + 1 :] == ["--schedule", str(tmp_path / "schedule")]
