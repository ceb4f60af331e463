"""Issue 17: a job's published ports are reached only at its route's address, and only from its
`ingress_allow` sources.

Ports bind to the pool's `ingress_address` alone, on IPv4 and IPv6 alike (before: every address
of the node, both families). `ingress_allow` is enforced by INPUT rules in the network owner's
namespace. Docker's userland proxy shows loopback clients as the bridge's gateway, so the
sources are told apart from clients in a network namespace of the test's own (veth), through
the engine's forwarding. Real API, real Docker engine, a real HTTP server in the job."""

from __future__ import annotations

import socket
import time

import pytest

from config.builders import pinned_test_image, submit_job
from jobs.assignments import node_assignments
from scheduling.passes import scheduling_pass
from tests.worker_agent.conftest import IDS, make_owner, require_service, test_image
from tests.worker_agent.netns import Netns, available, stable_addresses
from worker_agent import addresses
from worker_agent.runtime.base import Assignment
from worker_agent.runtime.docker import OWNER_SUFFIX, DockerRuntime, GVisorRuntime

__all__ = ["test_image"]  # a fixture of the agent's tests, used here
PAGE = b"hello-ingress"
SERVE = f"mkdir -p /tmp/w && echo {PAGE.decode()} > /tmp/w/index.html && httpd -f -p 8080 -h /tmp/w"


# ------------------------------------------------------------------ the contract


def submit(client, policy, **overrides):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "serve",
        "shape": "cpu-small",
        "image": pinned_test_image(),
        "command": ["true"],
        "ports": [8080],
        "network_policy": policy,
    } | overrides
    return client.post("/api/v1/jobs/", body, format="json")


def test_ingress_allow_is_accepted_normalised_and_stored(api, member, cpu_shape):
    policy = {"mode": "pool", "ingress_allow": ["203.0.113.0/24", "198.51.100.7"]}
    response = submit(api(member), policy)
    assert response.status_code == 201, response.json()
    assert response.json()["network_policy"] == {
        "mode": "pool",
        "egress_allow": [],
        "ingress_allow": ["203.0.113.0/24", "198.51.100.7/32"],
    }


@pytest.mark.parametrize(
    "policy",
    [
        {"mode": "none", "ingress_allow": ["203.0.113.0/24"]},  # no network, no ingress
        {"mode": "pool", "ingress_allow": ["not a cidr"]},
        {"mode": "pool", "ingress_allow": ["2001:db8::/32"]},  # the pool network is IPv4
        {"mode": "pool", "ingress_allow": "203.0.113.0/24"},
        {"mode": "pool", "ingress_allow": [f"10.0.{i}.0/24" for i in range(65)]},
    ],
)
def test_a_bad_ingress_allow_is_a_400(api, member, cpu_shape, policy):
    response = submit(api(member), policy)
    assert response.status_code == 400 and "network_policy" in response.json()["errors"]


def test_the_assignment_carries_ingress_allow_and_the_address(agent, tenant):
    policy = {"mode": "pool", "egress_allow": [], "ingress_allow": ["203.0.113.0/24"]}
    job = submit_job(agent.node.pool, tenant, ports=[8080], network_policy=policy)
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    [entry] = node_assignments(node=agent.node)
    assert entry["network_policy"]["ingress_allow"] == ["203.0.113.0/24"]
    assert entry["pool_network"]["ingress_address"] == "node"
    parsed = Assignment.parse(entry)
    assert parsed.ingress_allow == ("203.0.113.0/24",) and parsed.ports == (8080,)


# ------------------------------------------------------------------ on the engine


@pytest.fixture
def runtime(docker_client):
    runtime = DockerRuntime(make_owner("test-node-ingress"), client=docker_client)
    runtime.created = []
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


@pytest.fixture(scope="module")
def space():
    require_service(available() is None, f"a network namespace of our own ({available()})")
    netns = Netns()
    yield netns
    netns.close()


def serve(runtime, image, workdir, bind, sources=(), ready=None):
    """A job serving PAGE on container port 8080, published on `bind`; its host port, once
    `ready(port)` (default: a fetch from here) gets the page."""
    number = next(IDS)
    a = Assignment.parse(
        {
            "job": number,
            "lease": number + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["sh", "-c", SERVE],
            "ports": [8080],
            "network_policy": {"mode": "pool", "ingress_allow": list(sources)},
            "pool_network": {"ingress_address": bind},
            # the default pids: a gVisor sandbox counts its own threads too
            "limits": {
                "cpu_millicores": 200,
                "memory_mib": 32,
                "pids": 1024,
                "output_limit_mib": 16,
            },
        }
    )
    for name in ("outputs", "inputs"):
        (workdir / name).mkdir(exist_ok=True)
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.created.append(container)
    runtime.start(container)
    container.reload()
    owner = runtime.client.containers.get(container.name + OWNER_SUFFIX)
    bindings = owner.attrs["NetworkSettings"]["Ports"]["8080/tcp"]
    assert [b["HostIp"] for b in bindings] == [bind]  # one binding: this address, no wildcard
    assert runtime.ports(container) == {"8080": int(bindings[0]["HostPort"])}
    port = int(bindings[0]["HostPort"])
    deadline = time.monotonic() + 10
    ready = ready or (lambda port: fetch(bind, port))
    while not ready(port):  # httpd up
        assert time.monotonic() < deadline, "the job's server did not answer"
        time.sleep(0.2)
    return port


def fetch(host: str, port: int, sock=None) -> bytes | None:
    """The page through `sock` (or a new connection from here), None when it cannot connect."""
    if sock is None:
        try:
            sock = socket.create_connection((host, port), timeout=2)
        except OSError:
            return None
    with sock:
        sock.settimeout(3)
        try:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        except OSError:
            return None
    return data


def other_addresses(family) -> list[str]:
    return [
        str(address)
        for address in stable_addresses()
        if address.version == family and not address.is_loopback and not address.is_link_local
    ]


@pytest.mark.docker
def test_an_ipv4_ingress_address_publishes_there_only(runtime, test_image, tmp_path):
    port = serve(runtime, test_image, tmp_path, "127.0.0.1")
    assert PAGE in fetch("127.0.0.1", port)
    assert fetch("::1", port) is None  # no IPv6 binding at all
    for address in other_addresses(4) + other_addresses(6):
        assert fetch(address, port) is None, address  # not on the node's other addresses


@pytest.mark.docker
def test_an_ipv6_ingress_address_publishes_there_only(runtime, test_image, tmp_path):
    if not socket.has_ipv6 or "::1" not in [
        str(net.network_address) for _, net in addresses.host_networks("")
    ]:
        pytest.skip("no IPv6 loopback on this machine")
    port = serve(runtime, test_image, tmp_path, "::1")
    assert PAGE in fetch("::1", port)
    assert fetch("127.0.0.1", port) is None
    for address in other_addresses(4) + other_addresses(6):
        assert fetch(address, port) is None, address


@pytest.mark.docker
def test_ingress_allow_admits_only_its_sources(runtime, test_image, tmp_path, space):
    """The port is published on the host side of the test's veth; two clients in the test's
    namespace, one source allowed: the other one's connection goes unanswered."""

    def from_allowed(port):
        sock = space.connect(space.host, port, source=space.address)
        return not isinstance(sock, OSError) and fetch(space.host, port, sock)

    port = serve(runtime, test_image, tmp_path, space.host, [f"{space.address}/32"], from_allowed)
    assert fetch(space.host, port) is None  # the node itself is no allowed source either
    allowed = space.connect(space.host, port, source=space.address)
    assert not isinstance(allowed, OSError), allowed
    assert PAGE in fetch(space.host, port, allowed)
    refused = space.connect(space.host, port, source=space.other, timeout=2)
    assert isinstance(refused, OSError), "a source outside ingress_allow got through"
    # without ingress_allow every source that reaches the address is admitted
    open_port = serve(runtime, test_image, tmp_path, space.host)
    other = space.connect(space.host, open_port, source=space.other)
    assert not isinstance(other, OSError), other
    assert PAGE in fetch(space.host, open_port, other)


def test_node_binds_to_the_agents_own_route_address(tmp_path):
    """`ingress_address: "node"` (the default) is the agent's `--address`; a pool's address
    wins over it. What the runner settles is what the runtime binds and the route names."""
    from worker_agent.runner import Runner

    def bound(knob, address):
        a = Assignment.parse(
            {
                "job": 1,
                "lease": 2,
                "fencing_token": "1",
                "ports": [8080],
                "network_policy": {"mode": "pool"},
                "pool_network": {"ingress_address": knob},
            }
        )
        runner = Runner(a, client=None, runtime=None, workdir=tmp_path, address=address)
        return runner._bound(a).pool_network.ingress_address

    assert bound("node", "198.51.100.4") == "198.51.100.4"
    assert bound("node", "localhost") in ("127.0.0.1", "::1")  # a name, resolved on the node
    assert bound("127.0.0.1", "198.51.100.4") == "127.0.0.1"
    assert bound("::1", "198.51.100.4") == "::1"


@pytest.mark.docker
def test_a_gvisor_jobs_port_keeps_its_binding_and_ingress_allow(
    docker_client, test_image, tmp_path, space
):
    """Under runsc-netns the job serves from the owner's namespace: the same single binding and
    the same ingress rules as under runc. runsc's host network drops a share of the connections
    it accepts (docs/data-plane.md "Runtimes"), so an allowed client tries a few times; a refused
    one never connects at all."""
    require_service(GVisorRuntime.available(), "gVisor's runsc runtimes in dockerd")
    runtime = GVisorRuntime(make_owner("test-node-ingress"), client=docker_client)
    runtime.created = []

    def page_from(source, port):
        for _ in range(10):
            sock = space.connect(space.host, port, source=source)
            if isinstance(sock, OSError):
                return sock
            if PAGE in (fetch(space.host, port, sock) or b""):
                return PAGE
        return None

    try:
        allowed = [f"{space.address}/32"]
        port = serve(
            runtime,
            test_image,
            tmp_path,
            space.host,
            allowed,
            lambda port: page_from(space.address, port) == PAGE,
        )
        [container] = runtime.created
        assert container.attrs["HostConfig"]["Runtime"] == "runsc-netns"
        assert page_from(space.address, port) == PAGE
        refused = space.connect(space.host, port, source=space.other, timeout=2)
        assert isinstance(refused, OSError), "a source outside ingress_allow got through"
        assert fetch(space.host, port) is None  # nor the node itself
    finally:
        for container in runtime.created:
            runtime.remove(container)
