"""python manage.py bench_leases --clients N --seconds S --json

Measures the leases API over real HTTP against a server it starts on a free loopback port
(or --url), over PostgreSQL: DATABASE_URL, or postgres://postgres@127.0.0.1:5432/computepool_bench.
"""

import json
import os
import subprocess
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/computepool_bench"


def _ensure_database(url: str) -> None:
    from urllib.parse import urlsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


class Command(BaseCommand):
    help = "Benchmark lease grants through the HTTP API (one JSON object with --json)."

    def add_arguments(self, parser):
        parser.add_argument("--clients", type=int, default=16)
        parser.add_argument("--seconds", type=float, default=10.0)
        parser.add_argument("--url", default=None, help="An already running server")
        parser.add_argument("--workers", type=int, default=2, help="Server processes")
        parser.add_argument("--nodes", type=int, default=16)
        parser.add_argument("--warmup", type=float, default=1.0)
        parser.add_argument(
            "--server",
            choices=["gunicorn", "uvicorn", "daphne"],
            default=None,
            help="Default: gunicorn (WSGI, gthread) when installed, else uvicorn, else daphne",
        )
        parser.add_argument("--threads", type=int, default=32, help="Threads per gunicorn worker")
        parser.add_argument(
            "--rate",
            type=float,
            default=0.0,
            help="Open loop: total requests/s offered, spread over the clients (default: closed "
            "loop, each client sends its next request when the previous one answers)",
        )
        parser.add_argument(
            "--client",
            choices=["wrk", "python"],
            default=None,
            help="Load generator. Default: wrk (C) when installed and closed loop, else Python "
            "threads (which share the machine's cores with the server)",
        )
        parser.add_argument(
            "--worker-connections",
            type=int,
            default=0,
            help="Keep-alive connections per gunicorn worker (default: max(threads, "
            "clients / workers), so the clients spread evenly over the workers)",
        )
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        engine = settings.DATABASES["default"]["ENGINE"]
        if "postgresql" not in engine:
            # Re-run over PostgreSQL: the concurrency guarantees are proven there.
            url = os.environ.get("DATABASE_URL") or DEFAULT_URL
            if "postgres" not in url:
                url = DEFAULT_URL
            _ensure_database(url)
            env = {**os.environ, "DATABASE_URL": url}
            sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
        os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
        call_command("migrate", verbosity=0, interactive=False)
        from leases.bench.leases import run

        result = run(
            clients=opts["clients"],
            seconds=opts["seconds"],
            url=opts["url"],
            workers=opts["workers"],
            nodes=opts["nodes"],
            warmup=opts["warmup"],
            server=opts["server"],
            rate=opts["rate"],
            threads=opts["threads"],
            client=opts["client"],
            worker_connections=opts["worker_connections"],
        )
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key:>20}: {value}")
