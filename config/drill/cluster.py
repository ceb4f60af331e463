"""The drill's fleet on this machine (issue 25), each process apart, talking over TCP only.

`Cluster.start()` makes, in a work dir of its own: a PostgreSQL (initdb as the postgres user,
a free port) and a redis-server (a free port, no persistence), so restarting them never touches
the services other tests use; the schema and the drill's seed (pool `drill` with a short
heartbeat, tenants vision, nlp and audio with a member each, an operator, their API tokens); a
CA and a server certificate; web-0 and web-1 (TLS) behind one balancer address; a TCP proxy
between the control plane and Redis (the fault that cuts Redis cuts it); worker-0, worker-1
and one beat; and agents (Docker runtime), each in a network namespace of its own (a veth
pair to the host), with its own state dir, key and credential, talking to the balancer over
TLS with the drill's CA. It returns once every agent's node is ready.

`Cluster.stop()` undoes all of it, also after a start that failed midway, and is safe to call
twice. Names (namespaces, veths, the subnet) carry a random tag, so two drills never clash.
Every process writes to <work dir>/logs/<name>.log (appended across restarts).
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from config.drill.tls import make_certificates

# the role entry points' command lines: the same code a real fleet runs
from config.roles import agent_command, role_command

BASE_DIR = Path(__file__).resolve().parent.parent.parent
PROXY_SCRIPT = Path(__file__).with_name("proxy.py")
POOL = "drill"
TENANTS = ("vision", "nlp", "audio")
OPERATOR = "drill-operator"
TEST_IMAGE_TAG = "127.0.0.1:5000/computepool/busybox:test"  # config.builders.TEST_IMAGE_TAG
PG_USER = "postgres"
DATABASE = "computepool"
# what the control plane's containers carry (worker_agent/runtime/base.py LABEL)
CONTROL_PLANE_LABEL = "computepool.control_plane"
# the supervisor's look at the processes, and so the delay of a restart (systemd's RestartSec)
RESTART_S = 2.0


class ClusterError(Exception):
    """The drill's fleet could not start (the message says which part and where its log is)."""


# --- small helpers ---------------------------------------------------------------------------
def free_port(host: str = "0.0.0.0") -> int:
    """A TCP port free on every address (bound on the wildcard): the balancer listens on the
    loopback and on every veth's host side with it."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run(command: list[str], *, check: bool = True, timeout: float = 60, **kwargs):
    """A command to its end, its output captured; ClusterError naming it when it fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{' '.join(command[:4])}…: no end within {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        raise ClusterError(
            f"{' '.join(command)} exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}"
        )
    return done


def as_postgres(*command: str) -> list[str]:
    return ["runuser", "-u", PG_USER, "--", *command]


def _taken_subnets() -> set[ipaddress.IPv4Network]:
    out = run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    taken = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            taken.add(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return taken


def pick_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no address of this host is in (the agents' /30s come from
    it); random, so two drills at once almost never pick the same, and never one in use."""
    taken = _taken_subnets()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(200, 207)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(other) for other in taken):
            return net
    raise ClusterError("no free /24 in 10.200.0.0/13 for the agents' veths")


@dataclass
class Agent:
    name: str  # its node's name
    netns: str
    host_veth: str
    host_address: str  # the veth's host side: how the agent reaches the balancer
    address: str  # the veth's namespace side
    state_dir: Path
    command: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    enroll_token: str = ""
    process: subprocess.Popen | None = None
    node_id: int | None = None


@dataclass
class Cluster:
    workdir: Path | None = None  # where the run's own dir is made (default: the temp dir)
    agents_count: int = 3
    webs: int = 2
    workers: int = 2
    worker_concurrency: int = 1
    heartbeat_s: int = 2  # the pool's heartbeat interval; unreachable after 3 missed
    beat_lock_s: int = 10  # beat's leader lock (config/celery.py): how long a dead one holds it
    ready_timeout_s: float = 120
    keep: bool = False  # leave the work dir (logs) after stop

    def __post_init__(self):
        self.tag = secrets.token_hex(3)
        parent = Path(self.workdir or tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"drill-{self.tag}-", dir=parent))
        # PostgreSQL runs as postgres: it must get through to its data dir
        self.dir.chmod(0o711)
        self.logs = self.dir / "logs"
        self.logs.mkdir()
        self.pg_dir = self.dir / "pg"
        self.pg_port = self.redis_port = self.redis_proxy_port = self.api_port = 0
        self.processes: dict[str, subprocess.Popen] = {}
        self.web_ports: dict[str, int] = {}  # "web-0" → its port on the loopback
        self.commands: dict[str, tuple[list[str], dict]] = {}
        self.agents: list[Agent] = []
        self.tokens: dict[str, str] = {}
        self.control_plane = ""
        self.pool = POOL
        self.pool_id: int | None = None
        self.env: dict = {}
        self.ca_file = self.dir / "tls" / "ca.pem"
        self.subnet: ipaddress.IPv4Network | None = None
        self.pg_started = False
        self.stopped = False
        # the supervisor (as systemd's Restart= would): processes that exit on their own are
        # noted in `exits` and started again; a fault holds the names it kills and restarts
        self.exits: list[dict] = []
        self.held: set[str] = set()
        self.lock = threading.RLock()
        self._supervising = threading.Event()
        self._supervisor: threading.Thread | None = None

    # --- addresses the others use ---------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def database_url(self) -> str:
        return f"postgres://{PG_USER}@127.0.0.1:{self.pg_port}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def control_plane_labels(self) -> dict:
        return {CONTROL_PLANE_LABEL: self.control_plane}

    def connect(self, **kwargs) -> psycopg.Connection:
        """A connection to the drill's database (autocommit), for the faults' watches."""
        return psycopg.connect(
            f"postgresql://{PG_USER}@127.0.0.1:{self.pg_port}/{DATABASE}",
            autocommit=True,
            application_name="drill",
            connect_timeout=3,
            **kwargs,
        )

    # --- start ----------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.say_logs(sys.stderr)
            self.stop()
            raise

    def _start(self) -> None:
        self.make_namespaces()
        self.start_postgres()
        self.start_redis()
        self.control_environment()
        self.migrate_and_seed()
        make_certificates(
            self.dir / "tls", ["127.0.0.1", *(agent.host_address for agent in self.agents)]
        )
        self.start_control_plane()
        self.wait_for_api(timeout=90)
        for agent in self.agents:
            self.start_agent(agent, enroll=True)
        self.wait_for_nodes(timeout=self.ready_timeout_s)
        self._supervising.set()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while self._supervising.is_set():
            time.sleep(RESTART_S)
            with self.lock:
                if not self._supervising.is_set():
                    return
                for name, process in list(self.processes.items()):
                    if name in self.held or name == "beat-2" or process.poll() is None:
                        continue
                    self.exits.append(
                        {"name": name, "at": time.time(), "returncode": process.returncode}
                    )
                    self.spawn(name)

    @contextlib.contextmanager
    def hold(self, *names: str):
        """The supervisor leaves `names` alone meanwhile (a fault kills and restarts them)."""
        with self.lock:
            self.held.update(names)
        try:
            yield
        finally:
            with self.lock:
                self.held.difference_update(names)

    def make_namespaces(self) -> None:
        """Per agent: a namespace, a veth pair (host side x.x.x.1/30, namespace side .2/30),
        the namespace's loopback up and its default route through the host side."""
        self.subnet = pick_subnet()
        hosts = list(self.subnet.subnets(new_prefix=30))
        for i in range(self.agents_count):
            block = list(hosts[i].hosts())
            host_address, address = str(block[0]), str(block[1])
            netns = f"cpdrill-{self.tag}-{i}"
            host_veth, ns_veth = f"dr{self.tag}h{i}", f"dr{self.tag}n{i}"
            name = f"drill-{self.tag}-agent-{i}"
            agent = Agent(
                name=name,
                netns=netns,
                host_veth=host_veth,
                host_address=host_address,
                address=address,
                state_dir=self.dir / "agents" / name,
            )
            self.agents.append(agent)  # before it exists: stop() removes what was made of it
            run(["ip", "netns", "add", netns])
            run(["ip", "link", "add", host_veth, "type", "veth", "peer", "name", ns_veth])
            run(["ip", "link", "set", ns_veth, "netns", netns])
            run(["ip", "addr", "add", f"{host_address}/30", "dev", host_veth])
            run(["ip", "link", "set", host_veth, "up"])
            inside = ["ip", "netns", "exec", netns]
            run([*inside, "ip", "addr", "add", f"{address}/30", "dev", ns_veth])
            run([*inside, "ip", "link", "set", ns_veth, "up"])
            run([*inside, "ip", "link", "set", "lo", "up"])
            run([*inside, "ip", "route", "add", "default", "via", host_address])

    def start_postgres(self) -> None:
        self.pg_dir.mkdir()
        shutil.chown(self.pg_dir, PG_USER, PG_USER)
        log = self.logs / "postgres.log"
        log.touch()
        shutil.chown(log, PG_USER, PG_USER)
        run(
            as_postgres(
                "initdb", "-D", str(self.pg_dir), "-A", "trust", "-U", PG_USER, "-E", "UTF8",
                "--locale=C", "--no-sync",
            ),
            timeout=120,
        )  # fmt: skip
        self.pg_port = free_port("127.0.0.1")
        self.pg_ctl("start")
        self.pg_started = True
        with psycopg.connect(
            f"postgresql://{PG_USER}@127.0.0.1:{self.pg_port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def pg_ctl(self, action: str, *extra: str, timeout: float = 60) -> None:
        """pg_ctl on the drill's data dir (start, stop, restart); waits for it to finish."""
        # a disposable database: no fsync; its socket in its own data dir, never /run's
        options = (
            f"-c port={self.pg_port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.pg_dir} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c shared_buffers=32MB -c max_connections=200"
        )
        command = ["pg_ctl", "-D", str(self.pg_dir), "-w", "-t", str(int(timeout))]
        if action in ("start", "restart"):
            # its output to its log: a server holding our pipe would keep run() waiting
            command += ["-o", options, "-l", str(self.logs / "postgres.log")]
        if action in ("stop", "restart"):
            command += ["-m", "fast"]
        run(as_postgres(*command, *extra, action), timeout=timeout + 10)

    def start_redis(self) -> None:
        self.redis_port = free_port("127.0.0.1")
        # no persistence: a restart starts it empty, as a lost cache node would
        command = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no"]
        self.commands["redis"] = (command, dict(os.environ))
        self.spawn("redis")
        self.wait_for_port(self.redis_port, "redis", timeout=10)

    def control_environment(self) -> None:
        """The control plane's environment: the drill's database and (through the proxy) its
        Redis, its own secret key, key ring, media dir and metrics dir."""
        self.redis_proxy_port = free_port("127.0.0.1")
        metrics = self.dir / "metrics"
        metrics.mkdir()
        key = base64.urlsafe_b64encode(os.urandom(32)).decode()
        hosts = ["127.0.0.1", "localhost", *(agent.host_address for agent in self.agents)]
        self.env = os.environ | {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_proxy_port}/0",
            "CELERY_BROKER_URL": "",
            "CELERY_RESULT_BACKEND": "",
            "DEPLOYMENT_PREFIX": f"drill-{self.tag}",
            "SECRET_KEY": secrets.token_urlsafe(40),
            "ENCRYPTION_KEYS": f"drill={key}",
            "ALLOWED_HOSTS": ",".join(hosts),
            "MEDIA_ROOT": str(self.dir / "media"),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
            "REGISTRY_INSECURE_HOSTS": "127.0.0.1:5000,localhost:5000",
            "VOLUME_EXPORT_IMAGE": TEST_IMAGE_TAG,
            "DEBUG": "false",
            "PYTHONUNBUFFERED": "1",
            # a killed beat's successor waits this long for the dead one's leader lock
            "BEAT_LOCK_TIMEOUT_S": str(self.beat_lock_s),
        }
        for name in ("ENCRYPTION_KEYS_FILE", "TEST_DATABASE_NAME"):
            self.env.pop(name, None)

    def role_env(self, name: str) -> dict:
        """The control plane's environment, its database connections named after the process
        (pg_stat_activity.application_name: which process holds a lock)."""
        return self.env | {"DATABASE_URL": f"{self.database_url}?application_name=drill-{name}"}

    def manage(self, *args: str, timeout: float = 300) -> str:
        done = run(
            [sys.executable, str(BASE_DIR / "manage.py"), *args],
            env=self.role_env("manage"),
            cwd=BASE_DIR,
            timeout=timeout,
        )
        return done.stdout

    def migrate_and_seed(self) -> None:
        self.manage("migrate", "--noinput", timeout=600)
        done = run(
            [sys.executable, "-m", "config.drill.cluster", "seed", str(self.agents_count)],
            env=self.role_env("seed") | {"DRILL_HEARTBEAT_S": str(self.heartbeat_s)},
            cwd=BASE_DIR,
            timeout=120,
        )
        seeded = json.loads(done.stdout.strip().splitlines()[-1])
        self.tokens = seeded["tokens"]
        self.control_plane = seeded["control_plane"]
        self.pool_id = seeded["pool_id"]
        for agent, token in zip(self.agents, seeded["enrollment_tokens"], strict=True):
            agent.enroll_token = token

    def start_control_plane(self) -> None:
        tls = self.dir / "tls"
        redis_proxy = [sys.executable, str(PROXY_SCRIPT)]
        redis_proxy += ["--listen", f"127.0.0.1:{self.redis_proxy_port}"]
        redis_proxy += ["--backend", f"127.0.0.1:{self.redis_port}"]
        self.commands["redis-proxy"] = (redis_proxy, dict(os.environ))
        self.spawn("redis-proxy")
        self.wait_for_port(self.redis_proxy_port, "redis-proxy", timeout=10)
        backends = []
        for i in range(self.webs):
            port = self.web_ports[f"web-{i}"] = free_port("127.0.0.1")
            backends.append(f"127.0.0.1:{port}")
            command = role_command(
                "web", "--bind", f"127.0.0.1:{port}",
                "--certfile", str(tls / "server.pem"), "--keyfile", str(tls / "server.key"),
            )  # fmt: skip
            self.commands[f"web-{i}"] = (command, self.role_env(f"web-{i}"))
            self.spawn(f"web-{i}")
        self.api_port = free_port()
        balancer = [sys.executable, str(PROXY_SCRIPT)]
        for host in ["127.0.0.1", *(agent.host_address for agent in self.agents)]:
            balancer += ["--listen", f"{host}:{self.api_port}"]
        for backend in backends:
            balancer += ["--backend", backend]
        self.commands["balancer"] = (balancer, dict(os.environ))
        self.spawn("balancer")
        for i in range(self.workers):
            command = role_command(
                "worker", "--concurrency", str(self.worker_concurrency),
                "--hostname", f"worker-{i}@drill-{self.tag}",
            )  # fmt: skip
            self.commands[f"worker-{i}"] = (command, self.role_env(f"worker-{i}"))
            self.spawn(f"worker-{i}")
        self.commands["beat"] = (
            role_command("beat", "--schedule", str(self.dir / "beat-schedule")),
            self.role_env("beat"),
        )
        self.spawn("beat")

    def agent_env(self, agent: Agent, enroll: bool) -> dict:
        """What a node would have: no control-plane secret (the drill's CA is its --ca-file);
        the enrollment token in the environment on the first start only (never on the command
        line)."""
        keep = ("PATH", "HOME", "LANG", "TZ", "VIRTUAL_ENV", "DOCKER_HOST")
        env = {name: os.environ[name] for name in keep if name in os.environ}
        env |= {"PYTHONUNBUFFERED": "1", "WORKER_AGENT_LOG_FORMAT": "json"}
        if enroll and agent.enroll_token:
            env["WORKER_AGENT_ENROLL_TOKEN"] = agent.enroll_token
        return env

    def start_agent(self, agent: Agent, *, enroll: bool = False) -> subprocess.Popen:
        """The agent in its namespace (again: with its state dir, which holds its credential)."""
        agent.state_dir.mkdir(parents=True, exist_ok=True)
        command = agent_command(
            f"https://{agent.host_address}:{self.api_port}",
            agent.state_dir,
            ca_file=self.ca_file,
            pool=self.pool,
            node_name=agent.name,
            address=agent.address,
            runtime="docker",
            pause_image=TEST_IMAGE_TAG,
        )
        agent.command = ["ip", "netns", "exec", agent.netns, *command]
        agent.env = self.agent_env(agent, enroll)
        self.commands[agent.name] = (agent.command, agent.env)
        agent.process = self.spawn(agent.name)
        return agent.process

    # --- processes ------------------------------------------------------------------------
    def spawn(self, name: str) -> subprocess.Popen:
        """(Re)start the process `name` with its command and environment; a session of its own,
        so a fault kills it with its children and the drill's Ctrl-C does not reach it."""
        command, env = self.commands[name]
        with open(self.logs / f"{name}.log", "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start: {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command,
                env=env,
                cwd=BASE_DIR,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.processes[name] = process
        for agent in self.agents:
            if agent.name == name:
                agent.process = process
        return process

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """`sig` to the process and its children (its session's group)."""
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig == signal.SIGKILL:
            process.wait(timeout=10)

    def terminate(self, name: str, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL after `timeout`; its children too."""
        process = self.processes.get(name)
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=timeout)
        # what is left of its group (a child that outlived it)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=10)

    def wait_for_port(self, port: int, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive(name)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise ClusterError(f"{name} did not listen on {port} within {timeout:.0f} s")

    def check_alive(self, *names: str) -> None:
        for name in names or list(self.processes):
            process = self.processes.get(name)
            if process is not None and process.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {process.returncode} (log: {self.logs / name}.log)"
                )

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def api_answers(self, timeout: float = 3) -> bool:
        """GET /healthz through the balancer, TLS verified with the drill's CA (any status)."""
        try:
            with urllib.request.urlopen(
                f"{self.api_url}/healthz", timeout=timeout, context=self.ssl_context()
            ):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def wait_for_api(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.api_answers():
                return
            time.sleep(0.5)
        raise ClusterError(f"the API did not answer at {self.api_url} within {timeout:.0f} s")

    def node_states(self) -> dict[int, tuple[str, str, str]]:
        """node id → (state, reachability, agent runtime) of the drill pool's nodes."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT id, state, reachability, agent_runtime FROM nodes_node WHERE pool_id = %s",
                [self.pool_id],
            ).fetchall()
        return {row[0]: tuple(row[1:]) for row in rows}

    def agent_node_id(self, agent: Agent) -> int | None:
        try:
            info = json.loads((agent.state_dir / "agent.json").read_text())
        except (OSError, ValueError):
            return None
        return info.get("node_id")

    def wait_for_nodes(self, timeout: float, agents: list[Agent] | None = None) -> None:
        """Until each agent's node is ready, reachable and has said its runtime."""
        agents = self.agents if agents is None else agents
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            for agent in agents:
                agent.node_id = agent.node_id or self.agent_node_id(agent)
            states = self.node_states()
            if all(
                states.get(agent.node_id, ("",) * 3)[:2] == ("ready", "reachable")
                and states[agent.node_id][2]
                for agent in agents
            ):
                return
            time.sleep(0.5)
        said = {a.name: self.node_states().get(a.node_id) for a in agents}
        raise ClusterError(f"the agents' nodes were not all ready within {timeout:.0f} s: {said}")

    # --- stop -----------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Everything start made, in an order that leaves nothing running; each step runs even
        when one before it failed. Returns what could not be undone (empty: all of it)."""
        if self.stopped:
            return []
        self.stopped = True
        self._supervising.clear()
        with self.lock:  # a restart under way ends before the processes are stopped
            pass
        problems: list[str] = []

        def step(what, action, *args):
            try:
                action(*args)
            except Exception as exc:  # go on: the next step may still undo its part
                problems.append(f"{what}: {exc}")

        # the agents first (nothing new starts), then the control plane, then its services
        names = [a.name for a in self.agents] + [
            n for n in self.processes if n not in {a.name for a in self.agents}
        ]
        for name in names:
            if name in ("redis", "redis-proxy"):
                continue
            step(f"stop {name}", self.terminate, name)
        step("stop redis-proxy", self.terminate, "redis-proxy")
        step("stop redis", self.terminate, "redis")
        if self.pg_started:
            step("stop postgres", self.stop_postgres)
        if self.control_plane:
            step("remove containers", remove_containers, self.control_plane)
        for agent in self.agents:
            step(f"remove {agent.netns}", remove_namespace, agent)
        if not self.keep:
            step("remove the work dir", shutil.rmtree, self.dir)
        return problems

    def stop_postgres(self) -> None:
        try:
            self.pg_ctl("stop")
        except ClusterError:
            self.pg_ctl("stop", "-m", "immediate")
        self.pg_started = False

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (after stop: nothing)."""
        found = []
        namespaces = run(["ip", "netns", "list"], check=False).stdout
        links = run(["ip", "-o", "link", "show"], check=False).stdout
        for agent in self.agents:
            if agent.netns in namespaces:
                found.append(f"netns {agent.netns}")
            if f" {agent.host_veth}@" in links or f" {agent.host_veth}:" in links:
                found.append(f"veth {agent.host_veth}")
        for name, process in self.processes.items():
            if process.poll() is None:
                found.append(f"process {name} ({process.pid})")
        if self.control_plane:
            found += [f"container {c}" for c in containers_of(self.control_plane)]
        if self.pg_dir.exists() and not self.keep:
            found.append(f"data dir {self.pg_dir}")
        if self.dir.exists() and not self.keep:
            found.append(f"work dir {self.dir}")
        return found

    def say_logs(self, stream, lines: int = 25) -> None:
        for path in sorted(self.logs.glob("*.log")) if self.logs.exists() else ():
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            stream.write(f"--- {path.name} (last {len(tail)} lines)\n" + "\n".join(tail) + "\n")


def remove_namespace(agent: Agent) -> None:
    """The namespace (any process still in it killed first) and the veth pair."""
    pids = run(["ip", "netns", "pids", agent.netns], check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    run(["ip", "netns", "del", agent.netns], check=False)
    # deleting the namespace deletes its end of the pair, and so the pair; this is in case
    run(["ip", "link", "del", agent.host_veth], check=False)


def _docker():
    import docker

    return docker.from_env(timeout=30)


def containers_of(control_plane: str) -> list[str]:
    try:
        client = _docker()
    except Exception:
        return []
    try:
        owned = {"label": f"{CONTROL_PLANE_LABEL}={control_plane}"}
        return [c.name for c in client.containers.list(all=True, filters=owned)]
    finally:
        client.close()


def remove_containers(control_plane: str) -> None:
    """The drill's containers (by the control-plane label) and its volumes (by name prefix)."""
    client = _docker()
    try:
        owned = {"label": f"{CONTROL_PLANE_LABEL}={control_plane}"}
        for container in client.containers.list(all=True, filters=owned):
            container.remove(force=True)
        for volume in client.volumes.list():
            if volume.name.startswith(f"computepool-{control_plane}"):
                volume.remove(force=True)
    finally:
        client.close()


# --- the seed (run as `python -m config.drill.cluster seed N` in the drill's environment) ------
def seed(agents: int, heartbeat_s: int) -> dict:
    """The drill's pool, tenants, people, tokens and one enrollment token per agent."""
    from django.contrib.auth import get_user_model  # noqa: F401 (Django is set up by now)

    from config.builders import (
        build_person,
        build_pool,
        build_tenant,
        build_token,
        set_pool_knobs,
    )
    from config.demo import agent_enrollment_token, ensure_priority_classes
    from nodes.selectors import control_plane_id
    from pools.choices import PlatformRole, TenantRole
    from pools.models import Quota, ResourceShape

    pool = build_pool(POOL, name="Drill", heartbeat_interval_s=heartbeat_s)
    set_pool_knobs(
        pool,
        ingress_address="127.0.0.1",
        default_priority_class="batch",
        stop_grace_s=2,
        startup_timeout_s=120,
        preemption_min_runtime_s=5,
        preemption_notice_s=2,
    )
    ensure_priority_classes()
    ResourceShape.objects.update_or_create(
        pool=pool, name="tiny", defaults={"cpu_millicores_min": 100, "memory_mib_min": 64}
    )
    tokens = {}
    for slug in TENANTS:
        tenant = build_tenant(slug)
        Quota.objects.create(
            tenant=tenant, pool=pool, cpu_millicores=64000, memory_mib=262144, gpus=4
        )
        member = build_person(f"{slug}-member", tenant=tenant, role=TenantRole.MEMBER)
        tokens[slug] = build_token(member, name="drill")
    operator = build_person(OPERATOR, platform_role=PlatformRole.OPERATOR)
    tokens["operator"] = build_token(operator, name="drill")
    return {
        "tokens": tokens,
        "control_plane": control_plane_id(),
        "pool_id": pool.pk,
        "enrollment_tokens": [agent_enrollment_token(POOL) for _ in range(agents)],
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["seed"]:
        import django

        django.setup()
        print(json.dumps(seed(int(sys.argv[2]), int(os.environ.get("DRILL_HEARTBEAT_S", "2")))))
