"""The leases API throughput benchmark: real HTTP clients against a real server on loopback.

`run(pool=…, tenant=…, secret=…, clients=…, seconds=…, url=None, ...)` takes a pool seeded by
the caller (`manage.py bench_leases`, with config.builders: nodes with room for every grant the
run can make, a tenant and a member's token `secret`), starts a server on a free loopback port
(gunicorn gthread by default; unless `url` names a running server that uses the same database),
drives `clients` keep-alive connections that each POST /api/v1/compute-leases in a loop — with
`wrk` (C, leases/bench/leases.lua) when it is installed, else with Python threads — then checks
the pool's ledger. Returns one dict of figures.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection

from leases import selectors

BASE_DIR = settings.BASE_DIR


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def default_server() -> str:
    for name in ("gunicorn", "uvicorn"):
        if importlib.util.find_spec(name):
            return name
    return "daphne"


def keeps_alive(threads: int, worker_connections: int) -> bool:
    """Whether gunicorn gthread keeps client connections alive under this configuration."""
    return worker_connections > threads


def start_servers(
    workers: int, env: dict, server: str, threads: int = 32, worker_connections: int = 1000
) -> tuple[list[str], list[subprocess.Popen]]:
    """gunicorn: `workers` gthread processes with `threads` threads each, on one port;
    uvicorn: `workers` processes on their own ports; daphne: `workers` processes sharing a
    listening socket by file descriptor. Returns the base URLs and the processes."""
    if server == "gunicorn":
        ports = [_free_port()]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "--bind",
                    f"127.0.0.1:{ports[0]}",
                    "--workers",
                    str(workers),
                    "--worker-class",
                    "gthread",
                    "--threads",
                    str(threads),
                    "--backlog",
                    "2048",
                    "--worker-connections",
                    str(worker_connections),
                    # gthread keeps a connection alive only while fewer than
                    # worker_connections - threads are idle; with no room it answers
                    # `Connection: close` anyway. Said explicitly (and without its warning).
                    "--keep-alive",
                    "2" if keeps_alive(threads, worker_connections) else "0",
                    "--log-level",
                    "warning",
                    "config.wsgi:application",
                ],
                cwd=BASE_DIR,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        ]
    elif server == "uvicorn":
        # One single-process uvicorn per worker, each on its own port; clients spread over them.
        # (--host/--port, not --fd, and not --workers: an inherited or re-pickled socket loses
        # TCP_NODELAY on accepted connections, adding ~40 ms Nagle/delayed-ACK stalls.)
        ports = [_free_port() for _ in range(workers)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--http",
                    "httptools" if importlib.util.find_spec("httptools") else "h11",
                    "--lifespan",
                    "off",
                    "--no-access-log",
                    "--log-level",
                    "warning",
                    "config.asgi:application",
                ],
                cwd=BASE_DIR,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for port in ports
        ]
    elif server == "hypercorn":
        # what the web role runs (config/roles.py): one hypercorn per worker, each on its own
        # port, with the product's settings (config/hypercorn.py) and its access log, which
        # goes to a file here (a pipe nobody reads would fill and stall the server)
        ports = [_free_port() for _ in range(workers)]
        procs = []
        for port in ports:
            log = tempfile.TemporaryFile()  # noqa: SIM115 - the process's, closed with it
            command = [sys.executable, "-m", "hypercorn", "--config", "python:config.hypercorn"]
            command += ["--bind", f"127.0.0.1:{port}", "config.asgi:application"]
            procs.append(subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=log, stderr=log))
            procs[-1].log = log
    else:
        ports = [_free_port()]
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", ports[0]))
        listener.listen(1024)
        fd = listener.fileno()
        daphne = os.path.join(os.path.dirname(sys.executable), "daphne")
        procs = [
            subprocess.Popen(
                [daphne, "--fd", str(fd), "-v", "0", "config.asgi:application"],
                cwd=BASE_DIR,
                env=env,
                pass_fds=(fd,),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for _ in range(workers)
        ]
        listener.close()  # the children hold it
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            # a few requests per worker, so each has imported Django before the clock starts
            for port in ports * 4:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/api/v1/")
                conn.getresponse().read()
                conn.close()
            return urls, procs
        except OSError:
            if any(p.poll() is not None for p in procs):
                err = b"".join(_said(p) for p in procs if p.poll() is not None)
                raise RuntimeError(f"server failed to start: {err.decode()[-2000:]}") from None
            time.sleep(0.2)
    raise RuntimeError("server did not answer within 60 s")


def _said(process) -> bytes:
    """What a server that exited wrote on stderr (its log file, for hypercorn)."""
    if process.stderr is not None:
        return process.stderr.read() or b""
    process.log.seek(0)  # the process has exited: nothing shares the offset any more
    return process.log.read()


def stop_servers(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


class Client(threading.Thread):
    def __init__(self, url, token, body, stop_at, warm_until, interval=0.0):
        super().__init__(daemon=True)
        self.interval = interval  # > 0: open loop, one request every `interval` seconds
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.body = json.dumps(body)
        self.stop_at, self.warm_until = stop_at, warm_until
        self.latencies: list[float] = []
        self.granted = self.refused = self.errors = self.conflicts = 0
        self.error_samples: list[str] = []

    def connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.connect()
        # small request/response writes: never wait on Nagle + delayed ACK (40 ms stalls)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def run(self):
        conn = self.connect()
        next_at = time.perf_counter() + random.random() * self.interval
        while True:
            if self.interval:
                pause = next_at - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                next_at += self.interval
            started = time.perf_counter()
            if started >= self.stop_at:
                break
            try:
                conn.request("POST", "/api/v1/compute-leases", self.body, self.headers)
                response = conn.getresponse()
                payload = response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                try:
                    conn = self.connect()
                except OSError:
                    time.sleep(0.05)
                status, payload = 0, repr(exc).encode()
            elapsed = time.perf_counter() - started
            if started < self.warm_until:
                continue
            if status == 201:
                self.granted += 1
                self.latencies.append(elapsed)
                attempts = json.loads(payload).get("placement", {}).get("attempts", 1)
                self.conflicts += attempts - 1
            elif status == 409:
                self.refused += 1
                self.conflicts += json.loads(payload).get("conflicts", 0)
            else:
                self.errors += 1
                if len(self.error_samples) < 3:
                    self.error_samples.append(f"{status}: {payload[:200]!r}")
        conn.close()


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu_s(pids) -> float:
    """User + system CPU seconds of these processes (Linux /proc; 0 elsewhere)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / _TICK


def _with_children(pids) -> list[int]:
    """The processes and their children (gunicorn workers live under the master)."""
    found = list(pids)
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in pids:
                found.append(int(entry))
    return found


def _postgres_pids(database: str | None = None) -> list[int]:
    """PostgreSQL processes: with `database`, only the backends connected to it plus the
    background processes (WAL writer, checkpointer …), not other databases' backends (other
    people's test runs on the same server)."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if not f.read().startswith("postgres"):
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            client = "(" in title or "[local]" in title
            if database is None or not client or f" {database} " in title:
                pids.append(int(entry))
    return pids


def _machine_busy() -> tuple[int, int]:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return 0, 0
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def wrk_path() -> str | None:
    """Debian's `wrk` (a C load generator), when installed: it leaves the two cores to the
    server instead of spending them on 64 Python client threads."""
    return shutil.which("wrk")


def _run_wrk(url: str, token: str, body: dict, clients: int, seconds: float, warmup: float):
    """Closed loop over `clients` keep-alive connections; a warm-up run first, not counted."""
    script = os.path.join(os.path.dirname(__file__), "leases.lua")
    env = {**os.environ, "BENCH_BODY": json.dumps(body), "BENCH_TOKEN": token}
    wrk_threads = str(max(1, min(2, clients)))

    def once(duration: float) -> dict:
        out = subprocess.run(
            [
                wrk_path(),
                "-t",
                wrk_threads,
                "-c",
                str(clients),
                "-d",
                f"{max(1, round(duration))}s",
                "--timeout",
                "30s",
                "-s",
                script,
                f"{url}/api/v1/compute-leases",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=duration + 60,
        )
        for line in out.stdout.splitlines():
            if line.startswith("BENCH_JSON "):
                return json.loads(line[len("BENCH_JSON ") :])
        raise RuntimeError(f"wrk failed: {out.stdout[-1000:]} {out.stderr[-1000:]}")

    if warmup > 0:
        once(warmup)
    return once(seconds)


def _percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def run(
    *,
    pool,
    tenant,
    secret: str,
    clients: int,
    seconds: float,
    url: str | None = None,
    workers: int = 2,
    nodes: int = 16,
    warmup: float = 1.0,
    server: str | None = None,
    rate: float = 0.0,
    threads: int = 32,
    client: str | None = None,
    worker_connections: int = 0,
) -> dict:
    database = connection.settings_dict["NAME"]
    procs = []
    try:
        if url is None:
            env = dict(os.environ)
            env["DJANGO_SETTINGS_MODULE"] = "config.settings_bench"
            env["DATABASE_URL"] = os.environ["DATABASE_URL"]
            # what a grant costs, not what the throttles refuse: 64 clients of one token and
            # tenant are past their default rates within a second (set either to measure it)
            env.setdefault("LEASE_THROTTLE_RATE", "")
            env.setdefault("TOKEN_THROTTLE_RATE", "")
            server = server or default_server()
            # Each gthread worker accepts keep-alive connections as fast as its main thread wins
            # the GIL: without a cap one worker often held 2-3x the other's connections and the
            # run was bound by that one process (the machine 57 % busy). The default cap (no
            # more connections than threads) leaves gthread no room for idle connections, so it
            # answers `Connection: close`: every request is a new loopback connection, taken by
            # whichever worker accepts first, which spreads the load. A larger
            # --worker-connections keeps connections alive (docs/benchmarks.md compares both).
            cap = worker_connections or max(threads, -(-clients // workers))
            keep_alive = keeps_alive(threads, cap) if server == "gunicorn" else None
            urls, procs = start_servers(workers, env, server, threads, cap)
        else:
            urls, keep_alive = [url], None
        body = {
            "pool": pool.slug,
            "tenant": tenant.slug,
            "resources": {"cpu_millicores_min": 100, "memory_mib_min": 64},
            "duration_s": 600,
        }
        # wrk (C) when installed, closed loop; the Python threads for --rate (open loop) or
        # when wrk is missing.
        client = client or ("wrk" if wrk_path() and not rate and len(urls) == 1 else "python")
        server_pids = _with_children([p.pid for p in procs])
        if client == "wrk":
            # the warm-up is a separate wrk run before the measured one
            if warmup > 0:
                _run_wrk(urls[0], secret, body, clients, warmup, 0)
            pg_before = {pid: _proc_cpu_s([pid]) for pid in _postgres_pids(database)}
            server_before = _proc_cpu_s(server_pids)
            busy_before = _machine_busy()
            out = _run_wrk(urls[0], secret, body, clients, seconds, 0)
            seconds = out["duration_us"] / 1e6
            granted = out["granted"]
            figures = {
                "p50_ms": round(out["p50_us"] / 1000, 1) if granted else None,
                "p99_ms": round(out["p99_us"] / 1000, 1) if granted else None,
                "max_ms": round(out["max_us"] / 1000, 1) if granted else None,
                "refused_409": out["refused"],
                "conflicts": out["conflicts"],
                "errors": out["errors"] + out["socket_errors"],
                "error_samples": [x for x in out["samples"].split("|") if x][:5],
            }
        else:
            start = time.perf_counter()
            warm_until = start + warmup
            stop_at = warm_until + seconds
            interval = clients / rate if rate else 0.0
            threads = [
                Client(urls[i % len(urls)], secret, body, stop_at, warm_until, interval)
                for i in range(clients)
            ]
            pg_before = {pid: _proc_cpu_s([pid]) for pid in _postgres_pids(database)}
            server_before = _proc_cpu_s(server_pids)
            busy_before = _machine_busy()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            latencies = [x for t in threads for x in t.latencies]
            granted = sum(t.granted for t in threads)
            figures = {
                "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
                "p99_ms": round(1000 * _percentile(latencies, 0.99), 1) if latencies else None,
                "max_ms": round(1000 * max(latencies), 1) if latencies else None,
                "refused_409": sum(t.refused for t in threads),
                "conflicts": sum(t.conflicts for t in threads),
                "errors": sum(t.errors for t in threads),
                "error_samples": [s for t in threads for s in t.error_samples][:5],
            }
        busy_after = _machine_busy()
        server_cpu = _proc_cpu_s(server_pids) - server_before
        # backends that ended during the run are missed; new ones count from zero
        pg_cpu = sum(
            _proc_cpu_s([pid]) - pg_before.get(pid, 0.0) for pid in _postgres_pids(database)
        )
        result = {
            "clients": clients,
            "seconds": seconds,
            "offered_rate": rate or None,
            "server": server if procs else "external",
            "keep_alive": keep_alive,
            "workers": workers if procs else None,
            "nodes": nodes,
            "url": urls[0] if len(urls) == 1 else urls,
            "client": client,
            "grants": granted,
            "grants_per_s": round(granted / seconds, 1),
            **figures,
            # where the CPU went (the whole run including warm-up; Linux only)
            "server_cpu_ms_per_grant": round(1000 * server_cpu / granted, 2) if granted else None,
            "postgres_cpu_ms_per_grant": round(1000 * pg_cpu / granted, 2) if granted else None,
            "machine_busy_percent": round(
                100 * (busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1])
            ),
        }
    finally:
        stop_servers(procs)
    result["overcommitted_nodes"] = selectors.overcommitted_nodes(pool)
    result["ledger_problems"] = len(selectors.ledger_problems(pool))
    return result
