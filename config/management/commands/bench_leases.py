"""python manage.py bench_leases --clients N --seconds S --json

Measures the leases API over real HTTP against a server it starts on a free loopback port
(or --url), over PostgreSQL: DATABASE_URL, or postgres://postgres@127.0.0.1:5432/computepool_bench.
It seeds its own pool with config.builders (the tests' and the demo's way) and removes it after;
the load itself is leases/bench/leases.py's.
"""

import json
import os
import secrets
import subprocess
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from config.builders import build_node, build_person, build_pool, build_tenant, build_token
from leases.bench.leases import run
from leases.models import Lease
from nodes.models import Node
from pools.actors import Actor

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


def seed(nodes: int, cpu_per_node: int, memory_per_node: int):
    """A pool of its own (allocatable == raw), a tenant, a member and the member's token."""
    tag = secrets.token_hex(4)
    actor = Actor.system("bench")
    with transaction.atomic():
        pool = build_pool(f"bench-{tag}", name=f"bench {tag}", exact_capacity=True)
        tenant = build_tenant(f"bench-{tag}", name=f"bench {tag}")
        user = build_person(f"bench-{tag}", tenant=tenant)
        secret = build_token(user, name="bench")
        for i in range(nodes):
            build_node(
                pool, f"bench-{i:03d}", cpu=cpu_per_node, memory=memory_per_node, actor=actor
            )
    return pool, tenant, user, secret


def cleanup(pool, tenant, user) -> None:
    with transaction.atomic():
        Lease.objects.filter(pool=pool).delete()
        Node.objects.filter(pool=pool).delete()
        pool.delete()
        tenant.delete()
        user.delete()


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
            choices=["gunicorn", "uvicorn", "daphne", "hypercorn"],
            default=None,
            help="Default: gunicorn (WSGI, gthread) when installed, else uvicorn, else daphne;"
            " hypercorn: what the web role serves with (config/roles.py)",
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
        # room for every grant: 100 millicores and 64 MiB each
        pool, tenant, user, secret = seed(opts["nodes"], 1000 * 1000, 1024 * 1024)
        try:
            result = self.measure(pool, tenant, secret, opts)
        finally:
            cleanup(pool, tenant, user)
        if opts["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key:>20}: {value}")

    def measure(self, pool, tenant, secret, opts) -> dict:
        return run(
            pool=pool,
            tenant=tenant,
            secret=secret,
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
