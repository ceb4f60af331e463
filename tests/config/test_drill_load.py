"""The drill's load (config/drill/load.py) against the real web server process on the test
database: leases reserved and released, jobs of several kinds submitted, a follower per tenant
that sees its tenant's events, a lost answer retried without a second job, and a hostile burst
that only ever gets 4xx answers."""

import contextlib
import os
import socket
import subprocess
import threading
import time

import certifi
import pytest
import requests
from django.conf import settings

from config.builders import SYSTEM, build_node, build_person, build_token
from config.drill.load import QUIET_S, Load, classify, hostile_burst, p99
from config.drill.tls import make_certificates
from config.roles import web_command
from jobs.models import Job, JobEvent
from jobs.services import job_cancel
from pools.choices import PlatformRole
from pools.models import Quota, ResourceShape
from tests.live_events import own_channel_layer
from tests.web_server import _free_port, _test_database_url, web_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def seed(pool, tenant, other_tenant, member, outsider) -> dict[str, str]:
    """The drill's seed in small: a `tiny` shape, a node, quotas; the tokens."""
    ResourceShape.objects.create(pool=pool, name="tiny", cpu_millicores_min=100, memory_mib_min=64)
    build_node(pool, "n1", cpu=8000, memory=16384)
    for t in (tenant, other_tenant):
        Quota.objects.create(tenant=t, pool=pool, cpu_millicores=64000, memory_mib=262144, gpus=0)
    operator = build_person("op", platform_role=PlatformRole.OPERATOR)
    return {
        "vision": build_token(member),
        "nlp": build_token(outsider),
        "operator": build_token(operator),
    }


# the loopback registry speaks plain HTTP (the drill's cluster says so too)
INSECURE_REGISTRY = "127.0.0.1:5000,localhost:5000"


@pytest.fixture
def fleet(pool, tenant, other_tenant, member, outsider):
    """The seed and one server."""
    tokens = seed(pool, tenant, other_tenant, member, outsider)
    with own_channel_layer():
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        with web_server(
            CHANNEL_LAYER_PREFIX=prefix, REGISTRY_INSECURE_HOSTS=INSECURE_REGISTRY
        ) as url:
            yield url, tokens


@pytest.fixture
def tls_fleet(pool, tenant, other_tenant, member, outsider, tmp_path):
    """The seed and one server over TLS, its certificate signed by a CA of the test's own
    (config/drill/tls.py, as the drill's): (url, CA file, tokens)."""
    tokens = seed(pool, tenant, other_tenant, member, outsider)
    certs = make_certificates(tmp_path, ["127.0.0.1"])
    port = _free_port()
    with own_channel_layer():
        env = os.environ | {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": _test_database_url(),
            "CHANNEL_LAYER_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
            "REGISTRY_INSECURE_HOSTS": INSECURE_REGISTRY,
        }
        command = web_command(f"127.0.0.1:{port}", certs.cert_file, certs.key_file)
        url = f"https://127.0.0.1:{port}"
        with (tmp_path / "web.log").open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        requests.get(f"{url}/accounts/login/", verify=certs.ca_file, timeout=5)
                        break
                    except requests.ConnectionError:
                        log_text = (tmp_path / "web.log").read_text()[-2000:]
                        assert process.poll() is None, log_text
                        assert time.monotonic() < deadline, log_text
                        time.sleep(0.3)
                yield url, certs.ca_file, tokens
            finally:
                process.terminate()
                process.wait(15)


def test_outcomes_are_classified_and_p99_is_the_99th_percentile():
    assert p99([]) is None
    assert p99([i / 100 for i in range(1, 101)]) == 1.0
    assert p99([0.1] * 99 + [5.0] * 2) == 5.0
    assert classify(None, TimeoutError()) == "connection_error"


def test_the_load_leases_submits_and_follows_every_event(fleet, pool, tenant):
    url, tokens = fleet
    load = Load(url, None, tokens, pool=pool.slug, seed=5, lease_clients=2, submit_every_s=0.1)
    started = time.time()
    load.start()
    time.sleep(6)
    load.stop()
    report = load.report()
    assert report["requests"].get("5xx", 0) == 0, report
    assert report["leases_held"] > 0 and report["requests_by_kind"]["lease"]["2xx"] > 0
    assert report["jobs_submitted"] >= 10
    assert set(report["jobs_by_kind"]) == {"plain", "gang", "checkpointable", "reservation"}
    assert report["refusals"] == {}, report["last_refusal"]
    jobs = Job.objects.filter(pool=pool)
    assert sorted(jobs.values_list("pk", flat=True)) == sorted(load.jobs)  # each submit once
    assert jobs.filter(gang__size=2).count() % 2 == 0
    assert load.p99_between(started, time.time()) == p99([s[1] for s in load.samples()])
    assert load.p99_between(0, 1) is None

    assert not load.wait_settled(2)  # nothing runs them here: they wait, queued
    for job in jobs.exclude(state__in=["cancelled"]):
        job_cancel(job=job, actor=SYSTEM)
    assert load.wait_settled(30)
    seen = load.followers_seen
    load.close()
    for slug, events in seen.items():
        expected = JobEvent.objects.filter(job__tenant__slug=slug).order_by("id")
        assert [(e["cursor"], e["job"], e["to"]) for e in events] == list(
            expected.values_list("id", "job_id", "to_state")
        )
    assert len(seen["vision"]) > 0


def test_followers_are_read_once_the_events_of_the_settling_reached_them(fleet, pool):
    """The followers have been quiet for long when the last job ends, and that end's wake-up
    is lost (published where the server does not listen, as while Redis is away): the event
    comes with the server's next timed read, and the followers are read after it."""
    url, tokens = fleet
    load = Load(url, None, tokens, pool=pool.slug, lease_clients=0, submit_every_s=60)
    load.start()
    load.stop()  # the submitter's first jobs only
    assert load.jobs
    time.sleep(QUIET_S + 1)  # quiet: the submits' events are long delivered
    with own_channel_layer():  # another prefix: the server's sockets get no wake-up
        for job in Job.objects.filter(pk__in=list(load.jobs)):
            job_cancel(job=job, actor=SYSTEM)
    assert load.wait_settled(10)
    seen = load.followers_seen
    load.close()
    got = {(e["job"], e["to"]) for events in seen.values() for e in events}
    assert {(job, "cancelled") for job in load.jobs} <= got


class DropFirstAnswer:
    """A TCP proxy that passes the first connection's request on and then closes it before
    the answer comes back (the answer is read and thrown away): a submit whose outcome the
    client never learns. Later connections pass both ways."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream))
            if self.dropped == 0:
                self.dropped = 1
                threading.Thread(target=self._swallow, args=(client, server), daemon=True).start()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _swallow(self, client, server):
        data = client.recv(65536)
        while b"\r\n\r\n" not in data:
            data += client.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(body) < length:
            body += client.recv(65536)
        server.sendall(data if len(body) == length else head + b"\r\n\r\n" + body)
        server.recv(65536)  # the server answered (the job exists); the client never hears it
        client.close()
        server.close()

    @staticmethod
    def _pipe(source, target):
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, target):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_a_submit_whose_answer_was_lost_is_retried_without_a_second_job(fleet, pool):
    url, tokens = fleet
    proxy = DropFirstAnswer(int(url.rsplit(":", 1)[1]))
    load = Load(f"http://127.0.0.1:{proxy.port}", None, tokens, pool=pool.slug)
    client = load._client(tokens["vision"])
    job_id = load._submit(client, load._job("vision", "retried"), "plain")
    assert proxy.dropped == 1 and load.submit_retries == 1
    assert list(Job.objects.filter(name="retried").values_list("pk", flat=True)) == [job_id]
    # the lost answer: the connection closed, or (a server slower than the client's read
    # timeout on a loaded machine) a timeout; either way one retry, one job
    outcomes = load.report()["requests"]
    assert outcomes.pop("2xx") == 1
    assert list(outcomes.values()) == [1] and set(outcomes) <= {"connection_error", "timeout"}


def test_a_hostile_burst_gets_only_4xx_answers(fleet, pool):
    url, tokens = fleet
    node = pool.nodes.get().pk
    result = hostile_burst(url, None, tokens, node_id=node, pool=pool.slug)
    assert result["not_4xx"] == 0, result
    assert {"bad_shapes", "forged_callbacks", "other_tenants"} <= set(result)
    assert result["requests"] >= 25
    assert sum(result["other_tenants"]["outcomes"].values()) >= 8  # their job and lease existed
    assert Job.objects.filter(tenant__slug="vision", name="h").count() == 0


def test_over_tls_the_load_trusts_its_ca_whatever_the_environment_names(
    tls_fleet, pool, monkeypatch
):
    """requests lets REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE) override a Session's own `verify`,
    and ssl's defaults follow SSL_CERT_FILE: each names here the public CAs, which never signed
    the server's certificate. The load's requests, its followers' websockets and the hostile
    burst still verify the server with the CA they were given."""
    url, ca_file, tokens = tls_fleet
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.setenv(name, certifi.where())
    load = Load(url, ca_file, tokens, pool=pool.slug, lease_clients=1, submit_every_s=0.3)
    load.start()
    time.sleep(4)
    load.stop()
    report = load.report()
    assert set(report["requests"]) == {"2xx"}, report
    assert report["jobs_submitted"] > 0 and report["leases_held"] > 0
    seen = load.followers_seen
    load.close()
    assert len(seen["vision"]) > 0, report["followers"]
    assert report["followers"]["vision"]["connects"] == 1, report["followers"]
    hostile = hostile_burst(url, ca_file, tokens, pool=pool.slug)
    assert hostile["not_4xx"] == 0, hostile


class _Answer:
    def __init__(self, status_code: int):
        self.status_code = status_code

    def json(self):
        return {"id": 1}


def test_a_hostile_probe_whose_setup_failed_is_counted_skipped_never_silently_left_out(
    monkeypatch,
):
    """The other tenant's job and lease cannot be made (every setup request fails, retried
    with its key), and no node is named: their probes are not sent, and each is listed in
    `skipped` (which fails the drill's verdict), not just missing from the counts."""
    from config.drill import load

    calls = []

    def call(self, method, path, kind, **kwargs):
        calls.append((kind, method, path, kwargs.get("headers", {}).get("Idempotency-Key")))
        if kind == "setup":
            return None, "connection_error"
        return _Answer(400), "4xx:400"

    monkeypatch.setattr(load.Client, "call", call)
    monkeypatch.setattr(load._SignedClient, "call", call)
    monkeypatch.setattr(load, "SETUP_TRIES", 2)
    tokens = {"vision": "a", "nlp": "b", "operator": "c"}
    result = hostile_burst("https://127.0.0.1:1", None, tokens, node_id=None)
    assert result["not_4xx"] == 0 and "other_tenants" not in result
    skipped = result["skipped"]
    assert len(skipped) == 3 + 5 + 5, skipped
    assert sum("no node to name" in s for s in skipped) == 3
    assert sum("their job was not made: connection_error" in s for s in skipped) == 5
    assert sum("their lease was not made: connection_error" in s for s in skipped) == 5
    setups = [c for c in calls if c[0] == "setup"]
    assert len(setups) == 4  # each setup tried twice, with one key
    assert setups[0][3] == setups[1][3] and setups[2][3] == setups[3][3]
