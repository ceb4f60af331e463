"""Data locality (issue 23, docs/storage.md "Data locality").

On the node (real Docker engine, a real HTTP server in a network namespace of the test's own,
the agent's real fetch in the job's namespace): the second attempt asking for the same input is
served from the node's input cache — the server sends the body once; the second time it answers
the cache's conditional request with 304 and no body. The entry is the job's own file, read-only.

In the control plane (the real scheduling pass): a job placed next to its cached image has the
bytes that did not move in its lease's decision record."""

from __future__ import annotations

import os
from http.server import BaseHTTPRequestHandler

import pytest

from config.builders import build_node, build_pool, build_tenant, pinned_test_image, submit_job
from leases.models import Lease
from nodes.models import Node
from scheduling.passes import scheduling_pass
from tests.worker_agent.conftest import (  # noqa: F401
    IDS,
    docker_client,
    make_owner,
    require_service,
    test_image,
)
from tests.worker_agent.netns import Netns, available
from worker_agent import input_cache
from worker_agent.inputs import Fetcher
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import DockerRuntime

API = "http://127.0.0.1:8000"
BODY = os.urandom(256 * 1024)
ETAG = '"v1"'


class Versioned(BaseHTTPRequestHandler):
    """GET /data with an ETag; a matching If-None-Match is 304. Counts what it served."""

    served = {"200": 0, "304": 0}

    def do_GET(self):
        if self.headers.get("If-None-Match") == ETAG:
            Versioned.served["304"] += 1
            self.send_response(304)
            self.send_header("ETag", ETAG)
            self.end_headers()
            return
        Versioned.served["200"] += 1
        self.send_response(200)
        self.send_header("ETag", ETAG)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def space():
    require_service(available() is None, f"a network namespace of our own ({available()})")
    netns = Netns()
    yield netns
    netns.close()


@pytest.fixture
def runtime(docker_client):  # noqa: F811
    runtime = DockerRuntime(make_owner("test-node-locality"), client=docker_client)
    runtime.created = []
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


@pytest.fixture
def cache(tmp_path):
    made = input_cache.configure(tmp_path / "state" / "input-cache")
    yield made
    input_cache._CACHE = None


def attempt(image, url, tmp_path):
    number = next(IDS)
    a = Assignment.parse(
        {
            "job": number,
            "lease": number + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["cat", "/inputs/data"],
            "inputs": [{"url": url, "name": "data"}],
            "network_policy": {"mode": "none", "egress_allow": []},
            "pool_network": {"egress_allowed": ["198.18.0.0/15"]},
            "limits": {"cpu_millicores": 200, "memory_mib": 32, "pids": 32, "output_limit_mib": 16},
        }
    )
    workdir = tmp_path / f"job{number}"
    for name in ("outputs", "inputs"):
        (workdir / name).mkdir(parents=True)
        (workdir / name).chmod(0o777)
    return a, workdir


@pytest.mark.docker
def test_the_second_run_of_an_input_on_the_node_is_served_from_its_cache(
    runtime,
    test_image,  # noqa: F811
    space,
    cache,
    tmp_path,
):
    port = space.serve(Versioned)
    url = f"http://{space.address}:{port}/data"
    for run in (1, 2):
        a, workdir = attempt(test_image, url, tmp_path)
        runtime.pull(a)
        container = runtime.create(a, workdir, Fetcher.for_attempt(a, workdir, API))
        runtime.created.append(container)
        data = workdir / "inputs" / "data"
        assert data.read_bytes() == BODY
        assert data.stat().st_uid == 0 and not data.stat().st_mode & 0o222  # read-only, root's
        if run == 1:
            assert Versioned.served == {"200": 1, "304": 0}
        else:  # no body moved: the server answered the conditional request
            assert Versioned.served == {"200": 1, "304": 1}
    # the node's report: the input by its key, with its size; the one download measured
    assert cache.report() == [{"key": url, "bytes": len(BODY)}]
    [download] = cache.take_downloads()[:1]
    assert download["key"] == url and download["bytes"] == len(BODY)
    # the cache lives under the state dir, out of every job's reach
    assert oct(os.stat(cache.root).st_mode & 0o777) == "0o700"


def test_the_cache_keys_objects_and_is_bounded(tmp_path):
    signed = "https://store.example/bucket/key.bin?X-Amz-Signature=abc&X-Amz-Expires=60"
    assert input_cache.key_for(signed, presigned=True) == "https://store.example/bucket/key.bin"
    assert input_cache.key_for("HTTPS://Data.Example/a?v=2#part") == "https://data.example/a?v=2"
    assert input_cache.cacheable({"ETag": '"x"'}) == {"etag": '"x"', "last_modified": ""}
    assert input_cache.cacheable({"ETag": '"x"', "Cache-Control": "no-store"}) is None
    assert input_cache.cacheable({}) is None  # nothing to revalidate with: not kept
    cache = input_cache.InputCache(tmp_path / "c", max_bytes=250, max_entries=2)
    for n in range(3):
        source = tmp_path / f"s{n}"
        source.write_bytes(b"x" * 100)
        cache.store(f"https://d.example/{n}", source, {"etag": '"e"', "last_modified": ""})
    # two entries at most (and 250 bytes): the least recently used went
    assert [e["key"] for e in cache.report()] == ["https://d.example/2", "https://d.example/1"]
    assert cache.lookup("https://d.example/0") is None
    reloaded = input_cache.InputCache(tmp_path / "c", max_bytes=250, max_entries=2)
    assert {e["key"] for e in reloaded.report()} == {"https://d.example/1", "https://d.example/2"}


@pytest.mark.django_db
def test_a_job_placed_next_to_its_cached_image_records_the_bytes_that_did_not_move():
    pool = build_pool("locality", exact_capacity=True)
    tenant = build_tenant("locality-t")
    image = pinned_test_image()
    digest = image.rsplit("@", 1)[1]
    cold = build_node(pool, "a-cold")  # first by name: it would win a tie
    warm = build_node(pool, "b-warm")
    Node.objects.filter(pk=warm.pk).update(cached_data={digest: 123_456_789})
    Node.objects.filter(pk=cold.pk).update(pull_bytes_per_s=10e6)
    job = submit_job(pool, tenant, image=image)
    scheduling_pass()
    lease = Lease.objects.get(job=job)
    assert lease.node_id == warm.pk
    record = lease.placement
    assert record["data_avoided_bytes"] == 123_456_789
    assert record["data_moved_bytes"] == 0 and record["data_arrival_s"] == 0.0
    assert record["score_breakdown"]["data_locality"] == 1.0
