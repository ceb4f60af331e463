"""`make run`: the whole product in one terminal — ASGI server, Celery worker with beat.

With no Redis answering at REDIS_URL it serves an embedded Redis-protocol server (fakeredis)
on a free loopback port, so the broker and the channel layer work with nothing installed.
Ctrl-C stops everything it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start_embedded_redis() -> str:
    """A Redis-protocol server in a thread of this process; children reach it over TCP."""
    from fakeredis import TcpFakeServer

    port = _free_port()
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    threading.Thread(target=server.serve_forever, daemon=True, name="embedded-redis").start()
    return f"redis://127.0.0.1:{port}/0"


class Command(BaseCommand):
    help = "Run the ASGI server and a Celery worker with beat; Ctrl-C stops all."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))

    def handle(self, *args, host, port, **options):
        redis_url = settings.REDIS_URL
        redis_mode = f"external Redis at {redis_url}"
        if not _redis_answers(redis_url):
            redis_url = start_embedded_redis()
            redis_mode = f"embedded Redis-protocol server at {redis_url} (no Redis at REDIS_URL)"
        env = os.environ | {"REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        python = sys.executable
        commands = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "config.asgi:application"],
            "worker+beat": [
                python,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--beat",
                "--loglevel",
                "info",
                "--concurrency",
                "2",
                "--schedule",
                str(settings.BASE_DIR / "var" / "beat-schedule"),
            ],
        }
        database = settings.DATABASES["default"]
        self.stdout.write(self.style.SUCCESS("Compute Pool is starting:"))
        self.stdout.write(f"  console and API  http://{host}:{port}/   (API docs: /api/docs/)")
        self.stdout.write(f"  health           http://{host}:{port}/healthz")
        self.stdout.write(
            f"  database         {database['ENGINE'].rsplit('.', 1)[-1]}: {database['NAME']}"
        )
        self.stdout.write(f"  broker, channels {redis_mode}")
        self.stdout.write("  celery           worker with beat (scheduling sweeps)")
        self.stdout.write("Ctrl-C stops all of it.")
        processes = {name: subprocess.Popen(cmd, env=env) for name, cmd in commands.items()}
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for name, process in processes.items():
                    if process.poll() is not None:
                        self.stderr.write(f"{name} exited with {process.returncode}; stopping.")
                        stopping = True
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for process in processes.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
            self.stdout.write("Stopped.")
