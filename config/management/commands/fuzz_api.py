"""python manage.py fuzz_api [--examples N] [--json]   (`make fuzz`)

Schemathesis against the live schema of a running server: a throwaway PostgreSQL database
(`computepool_fuzz_<pid>`, dropped at the end; the demo's database is not touched), a world built
with config.builders (two tenants, a pool with a shape, a ready node running a job, leases),
a real token for each role, and a gunicorn on a free loopback port. Every operation of
`/api/schema/` is fuzzed with each role's credential, `--examples` cases each, under the
checks `not_a_server_error` (no 5xx), `response_schema_conformance` (every body as the schema
says) and `content_type_conformance`. Prints how many cases ran per role and exits non-zero on
any failure. The throttles are off in the server (they would only answer 429 sooner).
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from pools import encryption

DATABASE_PREFIX = "computepool_fuzz"  # + the run's pid: concurrent runs never share one
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
MARKER = "COMPUTEPOOL_FUZZ_DATABASE"  # names the throwaway database in the re-run
FUZZ_DIR = Path(settings.BASE_DIR) / "var" / "fuzz"  # the live schema, the server's log


def _database_url(name: str) -> str:
    base = os.environ.get("DATABASE_URL", "")
    if "postgres" not in base:
        base = "postgres://postgres@127.0.0.1:5432/computepool"
    return base.rsplit("/", 1)[0] + f"/{name}"


def _database(url: str, *statements: str) -> None:
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        for statement in statements:
            conn.execute(statement)


def seed() -> dict[str, str]:
    """The world the cases act on, and a bearer credential per role."""
    from config.builders import (
        SYSTEM,
        build_node,
        build_node_credential,
        build_person,
        build_pool,
        build_secret,
        build_tenant,
        build_token,
        cpu_request,
        submit_job,
    )
    from leases import services as leases
    from pools.choices import PlatformRole, TenantRole
    from pools.models import ResourceShape
    from scheduling.passes import scheduling_pass

    pool = build_pool("fuzz", exact_capacity=True)
    ResourceShape.objects.create(
        pool=pool, name="cpu-small", cpu_millicores_min=500, memory_mib_min=512
    )
    vision, nlp = build_tenant("vision"), build_tenant("nlp")
    node = build_node(pool, "fuzz-node", cpu=64000, memory=262144, scratch=100_000)
    build_secret(vision, "api-token")
    people = {
        "member": build_person("member", tenant=vision),
        "tenant_admin": build_person("tadmin", tenant=vision, role=TenantRole.ADMIN),
        "outsider": build_person("outsider", tenant=nlp),
        "operator": build_person("operator", platform_role=PlatformRole.OPERATOR),
        "policy_admin": build_person("padmin", platform_role=PlatformRole.POLICY_ADMIN),
        "shape_admin": build_person("sadmin", platform_role=PlatformRole.SHAPE_ADMIN),
    }
    everything = ("read", "logs:read", "outputs:read", "write")
    scopes = {"operator": (*everything, "operate")}
    tokens = {
        role: build_token(user, scopes=scopes.get(role, everything), name="fuzz")
        for role, user in people.items()
    }
    tokens["read_only"] = build_token(people["member"], scopes=("read",), name="fuzz-read")
    for tenant in (vision, nlp):
        submit_job(pool, tenant)
        leases.lease_reserve(
            pool=pool,
            tenant=tenant,
            request=cpu_request(cpu=500, memory=512),
            actor=SYSTEM,
            duration=timedelta(hours=1),
        )
    scheduling_pass(pool_id=pool.pk)
    tokens["node"] = build_node_credential(node)
    tokens["anonymous"] = ""
    return tokens


def start_server(env: dict, log: Path) -> tuple[str, subprocess.Popen]:
    """gunicorn on a free loopback port, its log to a file; answers once it serves the API."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", "1", "--worker-class", "gthread", "--threads", "8"]
    server = subprocess.Popen(
        [*command, "--timeout", "120", "config.wsgi:application"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise CommandError(f"the server did not start: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/schema/", timeout=5).read()
            return f"http://127.0.0.1:{port}", server
        except OSError:
            time.sleep(0.3)
    server.terminate()
    raise CommandError("the server did not answer within 60 s")


class Command(BaseCommand):
    help = "Fuzz the API with schemathesis: every operation, every role (make fuzz)."

    def add_arguments(self, parser):
        parser.add_argument("--examples", type=int, default=25, help="Cases per operation")
        parser.add_argument("--roles", default="", help="Comma-separated roles (default: all)")
        parser.add_argument("--include-path-regex", default="", help="Only these paths")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument(
            "--phases",
            default="examples,coverage,fuzzing",
            help="schemathesis phases (coverage: thousands of boundary cases per role)",
        )
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        name = os.environ.get(MARKER)
        if not name:  # re-run over a database of this run's own, dropped at the end
            name = f"{DATABASE_PREFIX}_{os.getpid()}"
            url = _database_url(name)
            _database(url, f'CREATE DATABASE "{name}"')
            try:
                # its seed and its server reach the loopback test registry as the tests do
                loopback = ",".join(settings.LOOPBACK_REGISTRY_HOSTS)
                env = {"REGISTRY_INSECURE_HOSTS": loopback, **os.environ, "DATABASE_URL": url}
                env[MARKER] = name
                if not settings.ENCRYPTION_KEYS:  # a throwaway ring for the throwaway database
                    env["ENCRYPTION_KEYS"] = f"fuzz={encryption.new_key()}"
                code = subprocess.call([sys.executable, *sys.argv], env=env)
            finally:
                _database(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            sys.exit(code)
        if settings.DATABASES["default"]["NAME"] != name:
            raise CommandError(f"refusing to seed {settings.DATABASES['default']['NAME']}")
        call_command("migrate", verbosity=0, interactive=False)
        tokens = seed()
        if opts["roles"]:
            tokens = {role: tokens[role] for role in opts["roles"].split(",")}
        env = {
            **os.environ,
            "PLACEMENT_THROTTLE_RATE": "",
            "LEASE_THROTTLE_RATE": "",
            "TOKEN_THROTTLE_RATE": "",
            "DEBUG": "false",
        }
        base, server = start_server(env, FUZZ_DIR / f"server-{name}.log")
        try:
            # the live schema, read once (anonymously: a node credential may not read it)
            schema = FUZZ_DIR / f"schema-{name}.json"
            with urllib.request.urlopen(f"{base}/api/schema/?format=json", timeout=30) as got:
                schema.write_bytes(got.read())
            results = {
                role: self.fuzz(base, schema, role, secret, opts) for role, secret in tokens.items()
            }
        finally:
            server.terminate()
            server.wait(timeout=30)
        total = {
            "cases": sum(r["cases"] for r in results.values()),
            "failures": sum(r["failures"] for r in results.values()),
            "operations": max(r["operations"] for r in results.values()),
            "examples_per_operation": opts["examples"],
            "roles": results,
        }
        if opts["json"]:
            self.stdout.write(json.dumps(total))
        else:
            for role, r in results.items():
                self.stdout.write(
                    f"{role:>14}: {r['cases']} cases over {r['operations']} operations, "
                    f"{r['failures']} failures"
                )
            self.stdout.write(
                f"{'total':>14}: {total['cases']} cases, {total['failures']} failures"
            )
        if total["failures"]:
            raise CommandError("schemathesis found failures (above)")

    def fuzz(self, base: str, schema: Path, role: str, secret: str, opts, workers: int = 2) -> dict:
        command = [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            str(schema),
            "--url",
            base,
            "--checks",
            CHECKS,
            "--max-examples",
            str(opts["examples"]),
            "--phases",
            opts["phases"],
            "--workers",
            str(workers),
            "--request-timeout",
            "30",
            "--no-color",
            "--suppress-health-check",
            "all",
        ]
        if secret:
            command += ["--header", f"Authorization: Bearer {secret}"]
        if opts["include_path_regex"]:
            command += ["--include-path-regex", opts["include_path_regex"]]
        if opts["seed"] is not None:
            command += ["--seed", str(opts["seed"])]
        # in var/fuzz: schemathesis keeps its cache (.schemathesis/) in the working directory
        done = subprocess.run(command, capture_output=True, text=True, cwd=FUZZ_DIR)
        output = done.stdout + done.stderr
        cases = re.search(r"Test cases:\s*(\d+) generated", output)
        operations = re.search(r"Selected:\s*(\d+)/", output)
        found = re.search(r"(\d+) unique failures?", output)
        if not found and done.returncode and "Runtime Error" in output and workers > 1:
            # schemathesis itself crashed, finding nothing (hypothesis building a strategy in
            # a worker thread hit CPython 3.11's "AST constructor recursion depth mismatch"):
            # a tool error, not a finding about the API; run the role again in one thread
            self.stderr.write(f"--- {role}: schemathesis crashed, once more in one thread ---")
            return self.fuzz(base, schema, role, secret, opts, workers=1)
        failures = int(found.group(1)) if found else int(done.returncode != 0)
        if failures:
            self.stderr.write(f"--- {role} ---\n{output[-8000:]}")
        return {
            "cases": int(cases.group(1)) if cases else 0,
            "operations": int(operations.group(1)) if operations else 0,
            "failures": failures,
        }
