"""The drill's load: what users would do to the fleet while it breaks, every request timed and
classified. Threads, each with its own HTTP session (TLS, verified with the drill's CA):

- lease clients: reserve a `tiny` lease through the public lease API, hold it, release it;
- one submitter: jobs from every tenant in turn (busybox, a second's sleep), some gangs of two,
  some checkpointable, some naming a reservation made just before with a window a few seconds
  ahead; a submit that fails without an answer is retried with the same `Idempotency-Key`, so
  a retry never makes a second job;
- followers, one per tenant: /ws/jobs/ with the tenant's token, reconnecting with
  `?after=<last cursor>` whenever the connection drops, every event recorded.

`hostile_burst` sends what no answer may accept: every reply must be a 4xx, and no probe may be
skipped (a probe whose setup failed is listed in `skipped`, which fails the verdict).
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import requests
import websockets

from config.builders import TEST_IMAGE_TAG
from worker_agent.identity import NodeKey

TIMEOUT = (3.0, 10.0)  # connect, read (s)
TERMINAL = {"succeeded", "failed", "cancelled", "lost"}
SUBMIT_TRIES = 6
QUIET_S = 6.0  # longer than the consumer's timer (pools.consumers.POLL_S, 5 s)
WS_REFUSALS = {4400, 4401, 4403}  # final: reconnecting would be refused again


def classify(response: requests.Response | None, error: Exception | None) -> str:
    """ "2xx", "4xx:<code>", "5xx", "timeout" or "connection_error"."""
    if error is not None:
        return "timeout" if isinstance(error, requests.Timeout) else "connection_error"
    if response.status_code < 300:
        return "2xx"
    if response.status_code < 500:
        return f"4xx:{response.status_code}"
    return "5xx"


def p99(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def tls_context(ca_file) -> ssl.SSLContext:
    """Verifies the server with `ca_file` alone (the system's CAs without one), whatever
    SSL_CERT_FILE or REQUESTS_CA_BUNDLE say."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, certificate required
    if ca_file:
        context.load_verify_locations(cafile=str(ca_file))
    else:
        context.load_default_certs()
    return context


class Client:
    """One thread's HTTP session; every request is recorded in `samples`."""

    def __init__(self, api_url: str, ca_file, token: str | None, samples: list, lock):
        self.base = api_url.rstrip("/") + "/api/v1"
        self.session = requests.Session()
        # given on every request: requests lets REQUESTS_CA_BUNDLE override a Session's own
        self.verify = str(ca_file) if ca_file else True
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.samples, self.lock = samples, lock

    def call(self, method: str, path: str, kind: str, **kwargs):
        """(response or None, outcome)."""
        started = time.time()
        clock = time.monotonic()
        response = error = None
        try:
            response = self.session.request(
                method, self.base + path, timeout=TIMEOUT, verify=self.verify, **kwargs
            )
        except requests.RequestException as exc:
            error = exc
        outcome = classify(response, error)
        with self.lock:
            self.samples.append((started, time.monotonic() - clock, outcome, kind))
        return response, outcome

    def close(self):
        self.session.close()


class Load:
    def __init__(
        self,
        api_url: str,
        ca_file,
        tokens: dict[str, str],
        *,
        pool: str = "drill",
        seed: int = 1,
        lease_clients: int = 4,
        submit_every_s: float = 0.5,
        followers: int = 3,
    ):
        self.api_url, self.ca_file, self.tokens, self.pool = api_url, ca_file, tokens, pool
        self.tenants = sorted(t for t in tokens if t != "operator")
        self.random = random.Random(seed)
        self.lease_clients, self.submit_every_s = lease_clients, submit_every_s
        self.followed = self.tenants[:followers]
        self.lock = threading.Lock()
        self._samples: list[tuple[float, float, str, str]] = []
        self.jobs: dict[int, str] = {}  # job id → tenant
        self.kinds: Counter = Counter()  # jobs submitted by kind
        self.submit_retries = 0
        self.submits_failed = 0
        self.leases_held = 0
        self.refusals: Counter = Counter()  # "kind: status code" of the 4xx answers to our work
        self.last_refusal: dict[str, str] = {}  # the last detail of each
        self.seen: dict[str, list[dict]] = {t: [] for t in self.followed}
        self.follower_stats = {t: Counter() for t in self.followed}
        self._last_event = time.monotonic()
        self._settled_at = 0.0  # when wait_settled saw every job final
        self._stop = threading.Event()  # no new work
        self._close = threading.Event()  # followers too
        self._threads: list[threading.Thread] = []
        self._followers: list[threading.Thread] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for tenant in self.followed:
            thread = threading.Thread(target=self._follow, args=(tenant,), daemon=True)
            self._followers.append(thread)
        for n in range(self.lease_clients):
            tenant = self.tenants[n % len(self.tenants)]
            self._threads.append(
                threading.Thread(target=self._lease_client, args=(tenant, n), daemon=True)
            )
        self._threads.append(threading.Thread(target=self._submitter, daemon=True))
        for thread in self._followers + self._threads:
            thread.start()

    def stop(self) -> None:
        """Stops sending new work (the followers keep following until `close`, or a second
        `stop`: a caller's clean-up after the audit)."""
        if self._stop.is_set():
            self.close()
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def close(self) -> None:
        self._stop.set()
        self._close.set()
        for thread in self._followers:
            thread.join(10)

    def wait_settled(self, timeout_s: float) -> bool:
        """Whether every submitted job reached a final state within `timeout_s`."""
        client = self._client(self.tokens["operator"])
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                open_jobs = self._open_jobs(client)
                if open_jobs is not None and not open_jobs:
                    with self.lock:  # every final event is committed by now
                        self._settled_at = time.monotonic()
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(1)
        finally:
            client.close()

    def _open_jobs(self, client: Client) -> set[int] | None:
        """Our jobs that are not final yet (None: the API did not answer)."""
        with self.lock:
            mine = set(self.jobs)
        still = set()
        for job_id in mine:
            response, outcome = client.call("GET", f"/jobs/{job_id}", "settle")
            if outcome != "2xx":
                return None
            if response.json()["state"] not in TERMINAL:
                still.add(job_id)
        return still

    @property
    def followers_seen(self) -> dict[str, list[dict]]:
        """What each tenant's follower saw, once QUIET_S (at most 30 s) passed without an event
        and since the jobs were seen settled: an event reaches its follower at the server's
        next read at the latest (pools.consumers.POLL_S), also one whose wake-up was lost (a
        publish while Redis was away; a socket whose groups a Redis restart forgot). Quiet
        alone is not enough: an event committed after a long quiet comes up to POLL_S later."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self.lock:
                since = max(self._last_event, self._settled_at)
            if time.monotonic() - since >= QUIET_S:
                break
            time.sleep(0.2)
        with self.lock:
            return {tenant: list(events) for tenant, events in self.seen.items()}

    # --- what comes out ----------------------------------------------------------------------

    def samples(self) -> list[tuple[float, float, str]]:
        with self.lock:
            return [(at, latency, outcome) for at, latency, outcome, _ in self._samples]

    def p99_between(self, t0: float, t1: float) -> float | None:
        return p99([latency for at, latency, _ in self.samples() if t0 <= at <= t1])

    def report(self) -> dict:
        with self.lock:
            samples = list(self._samples)
            by_kind: dict[str, Counter] = {}
            for _, _, outcome, kind in samples:
                by_kind.setdefault(kind, Counter())[outcome] += 1
            return {
                "requests": dict(Counter(outcome for _, _, outcome, _ in samples)),
                "requests_by_kind": {kind: dict(c) for kind, c in by_kind.items()},
                "p99_s": p99([latency for _, latency, _, _ in samples]),
                "jobs_submitted": len(self.jobs),
                "jobs_by_kind": dict(self.kinds),
                "submit_retries": self.submit_retries,
                "submits_failed": self.submits_failed,
                "leases_held": self.leases_held,
                "refusals": dict(self.refusals),
                "last_refusal": dict(self.last_refusal),
                "followers": {
                    tenant: {"events": len(self.seen[tenant]), **self.follower_stats[tenant]}
                    for tenant in self.followed
                },
            }

    # --- the threads -------------------------------------------------------------------------

    def _client(self, token: str | None) -> Client:
        return Client(self.api_url, self.ca_file, token, self._samples, self.lock)

    def _lease_client(self, tenant: str, n: int) -> None:
        client = self._client(self.tokens[tenant])
        rng = random.Random(self.random.random() + n)
        body = {"pool": self.pool, "tenant": tenant, "shape": "tiny", "duration_s": 30}
        try:
            while not self._stop.is_set():
                key = f"drill-lease-{uuid.uuid4()}"
                response, outcome = client.call(
                    "POST", "/compute-leases", "lease", json=body, headers={"Idempotency-Key": key}
                )
                if outcome == "2xx":
                    with self.lock:
                        self.leases_held += 1
                    self._stop.wait(rng.uniform(0.3, 1.5))
                    lease = response.json()["id"]
                    for _ in range(5):  # the release must land, or the lease holds to expiry
                        _, outcome = client.call(
                            "POST", f"/compute-leases/{lease}/release", "lease"
                        )
                        if outcome == "2xx" or outcome.startswith("4xx"):
                            break
                        time.sleep(0.5)
                self._stop.wait(rng.uniform(0.2, 1.0))
        finally:
            client.close()

    def _submitter(self) -> None:
        clients = {tenant: self._client(self.tokens[tenant]) for tenant in self.tenants}
        n = 0
        try:
            while not self._stop.is_set():
                tenant = self.tenants[n % len(self.tenants)]
                kind = self.random.choices(
                    ["plain", "gang", "checkpointable", "reservation"], [6, 1.5, 1.5, 1]
                )[0]
                self._submit_kind(clients[tenant], tenant, kind, n)
                n += 1
                self._stop.wait(self.submit_every_s)
        finally:
            for client in clients.values():
                client.close()

    def _job(self, tenant: str, name: str, **fields) -> dict:
        return {
            "tenant": tenant,
            "pool": self.pool,
            "name": name,
            "shape": "tiny",
            "image": TEST_IMAGE_TAG,
            "command": ["sh", "-c", "sleep 1"],
            "max_runtime_s": 60,
            **fields,
        }

    def _submit_kind(self, client: Client, tenant: str, kind: str, n: int) -> None:
        if kind == "gang":
            gang = {"name": f"drill-gang-{n}", "size": 2}
            for member in range(2):
                self._submit(client, self._job(tenant, f"gang-{n}-{member}", gang=gang), kind)
        elif kind == "checkpointable":
            self._submit(client, self._job(tenant, f"ckpt-{n}", checkpointable=True), kind)
        elif kind == "reservation":
            start = datetime.now(UTC) + timedelta(seconds=5)
            window = {
                "start": start.isoformat(),
                "end": (start + timedelta(seconds=120)).isoformat(),
                "tolerance_s": 60,
            }
            # room for the job's /outputs too: a reservation holds the job's disk as well
            resources = {"cpu_millicores_min": 100, "memory_mib_min": 64, "scratch_mib": 64}
            body = {"pool": self.pool, "tenant": tenant, "resources": resources, "window": window}
            response, outcome = client.call(
                "POST",
                "/compute-leases",
                "reservation",
                json=body,
                headers={"Idempotency-Key": f"drill-rsv-{uuid.uuid4()}"},
            )
            if outcome == "2xx":
                lease = response.json()["id"]
                job = self._job(tenant, f"rsv-{n}", reservation=lease, output_limit_mib=32)
                self._submit(client, job, kind)
        else:
            self._submit(client, self._job(tenant, f"job-{n}"), kind)

    def _refused(self, kind: str, response) -> None:
        try:
            body = response.json()
        except ValueError:
            body = {}
        key = f"{kind}: {response.status_code} {body.get('code', '')}"
        with self.lock:
            self.refusals[key] += 1
            self.last_refusal[key] = json.dumps(body)[:300]

    def _submit(self, client: Client, body: dict, kind: str) -> int | None:
        """POST /jobs, retried with the same key while no answer says what happened."""
        key = f"drill-{uuid.uuid4()}"
        for attempt in range(SUBMIT_TRIES):
            if attempt:
                with self.lock:
                    self.submit_retries += 1
                time.sleep(min(4.0, 0.5 * 2**attempt))
            response, outcome = client.call(
                "POST", "/jobs", "submit", json=body, headers={"Idempotency-Key": key}
            )
            if outcome == "2xx":
                with self.lock:
                    self.jobs[response.json()["id"]] = body["tenant"]
                    self.kinds[kind] += 1
                return response.json()["id"]
            if outcome.startswith("4xx") and outcome != "4xx:429":
                self._refused(kind, response)
                break  # refused for good (no capacity to name a reservation in, a quota)
        with self.lock:
            self.submits_failed += 1
        return None

    def _follow(self, tenant: str) -> None:
        asyncio.run(self._follow_async(tenant))

    async def _follow_async(self, tenant: str) -> None:
        url = self.api_url.replace("https://", "wss://").replace("http://", "ws://")
        context = tls_context(self.ca_file) if url.startswith("wss://") else None
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"}
        stats, events = self.follower_stats[tenant], self.seen[tenant]
        while not self._close.is_set():
            after = events[-1]["cursor"] if events else 0
            try:
                async with websockets.connect(
                    f"{url}/ws/jobs/?after={after}",
                    additional_headers=headers,
                    ssl=context,
                    open_timeout=10,
                ) as socket:
                    stats["connects"] += 1
                    while not self._close.is_set():
                        try:
                            message = await asyncio.wait_for(socket.recv(), 0.5)
                        except TimeoutError:
                            continue
                        with self.lock:
                            events.append(json.loads(message))
                            self._last_event = time.monotonic()
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                stats[f"closed:{code}"] += 1
                if code in WS_REFUSALS:
                    return
            except (OSError, TimeoutError, websockets.InvalidHandshake):
                stats["connect_failed"] += 1
            await asyncio.sleep(0.5)


# --- the hostile burst -------------------------------------------------------------------------


def hostile_burst(
    api_url: str, ca_file, tokens: dict[str, str], *, node_id=None, pool: str = "drill"
) -> dict:
    """Requests no answer may accept: bad shapes, forged node callbacks, other tenants' ids.
    Every answer must be a 4xx. Returns, by kind, each outcome's count and the requests that
    got anything else (`accepted`: a 2xx or a 5xx, a connection error or a timeout);
    `skipped`: the probes not sent, and why (no node to name; the other tenant's job or lease
    their setup could not make)."""
    tenants = sorted(t for t in tokens if t != "operator")
    me, other = tenants[0], tenants[1]
    samples, lock = [], threading.Lock()
    mine = Client(api_url, ca_file, tokens[me], samples, lock)
    theirs = Client(api_url, ca_file, tokens[other], samples, lock)
    anonymous = Client(api_url, ca_file, None, samples, lock)
    results: dict[str, dict] = {}
    skipped: list[str] = []  # probes not sent (their setup failed): each fails the verdict

    def skip(kind: str, labels: list[str], why: str) -> None:
        skipped.extend(f"{kind}: {label} ({why})" for label in labels)

    def expect_4xx(kind: str, label: str, client: Client, method: str, path: str, **kwargs):
        _, outcome = client.call(method, path, kind, **kwargs)
        entry = results.setdefault(kind, {"outcomes": Counter(), "accepted": []})
        entry["outcomes"][outcome] += 1
        if not outcome.startswith("4xx"):
            entry["accepted"].append(f"{label}: {outcome}")

    good = {"tenant": me, "pool": pool, "name": "h", "shape": "tiny", "image": TEST_IMAGE_TAG}
    for label, body in [
        ("not an object", [1, 2]),
        ("unknown key", good | {"cpu_cores": 4}),
        ("negative cpu", good | {"shape": None, "resources": {"cpu_millicores_min": -5}}),
        ("huge name", good | {"name": "x" * 5000}),
        ("NUL in a string", good | {"name": "a\u0000b"}),
        ("wrong type", good | {"max_runtime_s": "soon"}),
        ("bad gang", good | {"gang": {"name": "g", "size": 1000}}),
        ("deep nesting", good | {"env": json.loads("[" * 200 + "]" * 200)}),
    ]:
        expect_4xx("bad_shapes", f"POST /jobs {label}", mine, "POST", "/jobs", json=body)
    expect_4xx(
        "bad_shapes",
        "POST /jobs not JSON",
        mine,
        "POST",
        "/jobs",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    lease = {"pool": pool, "tenant": me, "shape": "tiny"}
    window = {"start": "2030-01-02T00:00:00Z", "end": "2030-01-01T00:00:00Z"}
    for label, body in [
        ("window ends before it starts", lease | {"window": window}),
        ("zero duration", lease | {"duration_s": 0}),
        ("no such pool", lease | {"pool": "no-such-pool"}),
    ]:
        expect_4xx(
            "bad_shapes",
            f"POST /compute-leases {label}",
            mine,
            "POST",
            "/compute-leases",
            json=body,
        )

    # forged node callbacks: a made-up credential, unsigned or signed by a key no node holds;
    # a person's token on the agent's endpoints; another node's actions as a tenant's member
    fake = Client(api_url, ca_file, "cpn_" + uuid.uuid4().hex, samples, lock)
    beat = {"state": "ready"}
    expect_4xx(
        "forged_callbacks", "unsigned heartbeat", fake, "POST", "/agent/heartbeat", json=beat
    )
    signed = _SignedClient(api_url, ca_file, "cpn_" + uuid.uuid4().hex, samples, lock)
    expect_4xx(
        "forged_callbacks",
        "heartbeat signed by a stranger's key",
        signed,
        "POST",
        "/agent/heartbeat",
        json=beat,
    )
    expect_4xx(
        "forged_callbacks",
        "job report signed by a stranger's key",
        signed,
        "POST",
        "/agent/jobs/1/report",
        json={"fencing_token": "1", "step": "running"},
    )
    expect_4xx("forged_callbacks", "assignments as a person", mine, "GET", "/agent/assignments")
    expect_4xx(
        "forged_callbacks", "heartbeat as a person", mine, "POST", "/agent/heartbeat", json=beat
    )
    expect_4xx(
        "forged_callbacks",
        "enroll with a made-up token",
        signed,
        "POST",
        "/enroll",
        json={"token": "cpe_" + uuid.uuid4().hex, "name": "rogue"},
    )
    node_probes = [
        ("drain another's node as a member", mine, "POST", "/nodes/{node}/drain", {}),
        (
            "revoke a node's credentials as a member",
            mine,
            "POST",
            "/nodes/{node}/revoke-credentials",
            {},
        ),
        (
            "a node's heartbeat anonymously",
            anonymous,
            "POST",
            "/agent/heartbeat",
            {"json": beat | {"node": node_id}},
        ),
    ]
    if node_id is None:
        skip("forged_callbacks", [p[0] for p in node_probes], "no node to name")
    else:
        for label, client, method, path, kwargs in node_probes:
            path = path.format(node=node_id)
            expect_4xx("forged_callbacks", label, client, method, path, **kwargs)

    # other tenants' ids: a job and a lease of `other`, reached with `me`'s token
    job_labels = ["GET job", "GET job events", "GET job logs", "POST job cancel"]
    job_labels.append("submit as their tenant")
    lease_labels = ["GET lease", "POST lease release", "POST lease renew"]
    lease_labels += ["reserve for their tenant", "name their lease as a reservation"]
    job, why = _made(theirs, "/jobs", good | {"tenant": other, "name": "theirs"})
    if job is None:
        skip("other_tenants", job_labels, f"their job was not made: {why}")
    else:
        for method, path in [
            ("GET", f"/jobs/{job}"),
            ("GET", f"/jobs/{job}/events"),
            ("GET", f"/jobs/{job}/logs"),
            ("POST", f"/jobs/{job}/cancel"),
        ]:
            expect_4xx("other_tenants", f"{method} {path}", mine, method, path)
        expect_4xx(
            "other_tenants",
            "submit as their tenant",
            mine,
            "POST",
            "/jobs",
            json=good | {"tenant": other},
        )
        theirs.call("POST", f"/jobs/{job}/cancel", "setup")
    lease_id, why = _made(theirs, "/compute-leases", lease | {"tenant": other, "duration_s": 30})
    if lease_id is None:
        skip("other_tenants", lease_labels, f"their lease was not made: {why}")
    else:
        for method, path in [
            ("GET", f"/compute-leases/{lease_id}"),
            ("POST", f"/compute-leases/{lease_id}/release"),
            ("POST", f"/compute-leases/{lease_id}/renew"),
        ]:
            expect_4xx("other_tenants", f"{method} {path}", mine, method, path, json={})
        expect_4xx(
            "other_tenants",
            "reserve for their tenant",
            mine,
            "POST",
            "/compute-leases",
            json=lease | {"tenant": other},
        )
        expect_4xx(
            "other_tenants",
            "name their lease as a reservation",
            mine,
            "POST",
            "/jobs",
            json=good | {"reservation": lease_id},
        )
        theirs.call("POST", f"/compute-leases/{lease_id}/release", "setup")
    for client in (mine, theirs, anonymous, fake, signed):
        client.close()
    out = {
        kind: {"outcomes": dict(e["outcomes"]), "accepted": e["accepted"]}
        for kind, e in results.items()
    }
    return out | {
        "requests": sum(sum(e["outcomes"].values()) for e in results.values()),
        "not_4xx": sum(len(e["accepted"]) for e in results.values()),
        "skipped": skipped,
    }


SETUP_TRIES = 3


def _made(client: Client, path: str, body: dict) -> tuple[int | None, str]:
    """(id, "") of what `client` made by POST `path`, retried with one Idempotency-Key while no
    answer says what happened; (None, the last outcome) when it was not made."""
    key = f"drill-hostile-{uuid.uuid4()}"
    outcome = ""
    for attempt in range(SETUP_TRIES):
        if attempt:
            time.sleep(0.5 * attempt)
        response, outcome = client.call(
            "POST", path, "setup", json=body, headers={"Idempotency-Key": key}
        )
        if outcome == "2xx":  # 201, or a replay of the key's first answer
            return response.json()["id"], ""
        if outcome.startswith("4xx") and outcome != "4xx:429":
            break  # refused for good
    return None, outcome


class _SignedClient(Client):
    """A made-up node: a bearer credential nobody issued, every request signed by a fresh key
    (as an agent signs, worker_agent/identity.py), so only the signature check can refuse it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.key = NodeKey.generate()

    def call(self, method: str, path: str, kind: str, **kwargs):
        request = requests.Request(method, self.base + path, **kwargs)
        prepared = self.key.sign(self.session.prepare_request(request))
        started, clock = time.time(), time.monotonic()
        response = error = None
        try:
            response = self.session.send(prepared, timeout=TIMEOUT, verify=self.verify)
        except requests.RequestException as exc:
            error = exc
        outcome = classify(response, error)
        with self.lock:
            self.samples.append((started, time.monotonic() - clock, outcome, kind))
        return response, outcome
