"""The drill's load (config/drill/load.py) against the real web server process on the test
database: leases reserved and released, jobs of several kinds submitted, a follower per tenant
that sees its tenant's events, a lost answer retried without a second job, and a hostile burst
that only ever gets 4xx answers."""

import contextlib
import socket
import threading
import time

import pytest
from django.conf import settings

from config.builders import SYSTEM, build_node, build_person, build_token
from config.drill.load import Load, classify, hostile_burst, p99
from jobs.models import Job, JobEvent
from jobs.services import job_cancel
from pools.choices import PlatformRole
from pools.models import Quota, ResourceShape
from tests.live_events import own_channel_layer
from tests.web_server import web_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet(pool, tenant, other_tenant, member, outsider):
    """The drill's seed in small: a `tiny` shape, a node, quotas, tokens, one server."""
    ResourceShape.objects.create(pool=pool, name="tiny", cpu_millicores_min=100, memory_mib_min=64)
    build_node(pool, "n1", cpu=8000, memory=16384)
    for t in (tenant, other_tenant):
        Quota.objects.create(tenant=t, pool=pool, cpu_millicores=64000, memory_mib=262144, gpus=0)
    operator = build_person("op", platform_role=PlatformRole.OPERATOR)
    tokens = {
        "vision": build_token(member),
        "nlp": build_token(outsider),
        "operator": build_token(operator),
    }
    with own_channel_layer():
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        # the loopback registry speaks plain HTTP (the drill's cluster says so too)
        insecure = "127.0.0.1:5000,localhost:5000"
        with web_server(CHANNEL_LAYER_PREFIX=prefix, REGISTRY_INSECURE_HOSTS=insecure) as url:
            yield url, tokens


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
    assert load.report()["requests"] == {"connection_error": 1, "2xx": 1}


def test_a_hostile_burst_gets_only_4xx_answers(fleet, pool):
    url, tokens = fleet
    node = pool.nodes.get().pk
    result = hostile_burst(url, None, tokens, node_id=node, pool=pool.slug)
    assert result["not_4xx"] == 0, result
    assert {"bad_shapes", "forged_callbacks", "other_tenants"} <= set(result)
    assert result["requests"] >= 25
    assert sum(result["other_tenants"]["outcomes"].values()) >= 8  # their job and lease existed
    assert Job.objects.filter(tenant__slug="vision", name="h").count() == 0
