"""The job network policy, enforced on the real Docker engine: mode `none` has no network; mode
`pool` reaches only its allow-list (iptables in the namespace of a network-owner container the
job shares, with no NET_ADMIN of its own). All traffic goes to HTTP servers in this test process,
listening in a network namespace of the test's own (tests/worker_agent/netns.py): never the node's
own addresses, which no job may reach, and it never leaves this machine."""

import shutil
import threading
import uuid
from http.server import BaseHTTPRequestHandler

import pytest

from worker_agent import netpolicy
from worker_agent.runtime import disks
from worker_agent.runtime.base import RuntimeFailure
from worker_agent.runtime.docker import OWNER_SUFFIX, POOL_NETWORK, DockerRuntime
from worker_agent.runtime.process import ProcessRuntime

from .conftest import make_owner, require_service
from .netns import Netns, available
from .test_docker_runtime import assignment as runtime_assignment


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from {self.server.server_port}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def netns():
    require_service(available() is None, f"a network namespace of our own ({available()})")
    space = Netns()
    yield space
    space.close()


@pytest.fixture(scope="module")
def servers(netns):
    """Two HTTP servers on free ports of the test namespace's address."""
    return [netns.serve(Hello) for _ in range(2)]


@pytest.fixture
def runtime(docker_client):
    runtime = DockerRuntime(make_owner("test-node-net"), client=docker_client)
    runtime.created = []
    original = runtime.create

    def create(a, workdir, fetcher=None):
        container = original(a, workdir, fetcher)
        runtime.created.append(container)
        return container

    runtime.create = create
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


@pytest.fixture
def gateway(netns) -> str:
    """The test namespace's address: the only address these tests send traffic to."""
    return netns.address


def assignment(image, command, mode="pool", allow=(), bound=("198.18.0.0/15",), **changes):
    return runtime_assignment(
        image,
        command,
        network_policy={"mode": mode, "egress_allow": list(allow)},
        pool_network={"egress_allowed": list(bound)},
        **changes,
    )


def fetch_both(gateway, ports) -> list[str]:
    """A job that tries both servers and says how each try ended (`timeout`, not `wget -T`:
    the test image's static busybox wget crashes with -T)."""
    script = "; ".join(
        f"timeout 3 wget -q -O - http://{gateway}:{port}/; echo rc{n}=$?"
        for n, port in enumerate(ports, 1)
    )
    return ["sh", "-c", script]


def run(runtime, a, workdir, timeout=30) -> tuple[object, str]:
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.start(container)
    assert runtime.wait(container, timeout) is not None, "the job did not end"
    return container, container.logs().decode()


@pytest.mark.docker
def test_agents_making_the_pool_network_at_once_all_join_one(docker_client, monkeypatch):
    """Docker makes a second network of one name without a word; a name that then resolves to
    two refused every job on the node (a fresh engine with two agents found it)."""
    from worker_agent.runtime import network_owner

    name = f"cp-test-pool-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(network_owner, "POOL_NETWORK", name)
    runtimes = [DockerRuntime(make_owner(f"test-node-{i}"), client=docker_client) for i in range(4)]
    start = threading.Barrier(len(runtimes))
    ids = []

    def make(runtime):
        start.wait()
        ids.append(runtime.networks.pool_network())

    threads = [threading.Thread(target=make, args=(runtime,)) for runtime in runtimes]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        left = [n for n in docker_client.networks.list(names=[name]) if n.name == name]
        assert len(ids) == len(runtimes) and len(set(ids)) == 1
        assert [n.id for n in left] == ids[:1]
        # a duplicate made by hand (an engine left so by an older agent) is folded the same way
        docker_client.networks.create(name, driver="bridge")
        assert runtimes[0].networks.pool_network() == ids[0]
        assert [n.id for n in docker_client.networks.list(names=[name]) if n.name == name] == ids[
            :1
        ]
    finally:
        for network in docker_client.networks.list(names=[name]):
            network.remove()


@pytest.mark.docker
def test_pool_job_reaches_only_its_allow_list(runtime, test_image, workdir, servers, gateway):
    allowed, other = servers
    command = fetch_both(gateway, servers)
    # The job also tries to change its network: without NET_ADMIN it may not.
    command[2] = "ip addr add 10.99.0.1/32 dev lo; echo ip=$?; " + command[2]
    a = assignment(test_image, command, allow=[f"{gateway}:{allowed}"])
    container, logs = run(runtime, a, workdir)
    assert f"hello from {allowed}" in logs
    assert "rc1=0" in logs
    assert f"hello from {other}" not in logs
    assert "rc2=0" not in logs
    assert "ip=0" not in logs  # the rules are not the job's to change
    owner = runtime.client.containers.get(container.name + OWNER_SUFFIX)
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == f"container:{owner.id}"
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert owner.labels["computepool.role"] == "network"
    assert owner.labels["computepool.job"] == str(a.job)
    assert owner.attrs["HostConfig"]["CapDrop"] == ["ALL"]
    assert owner.attrs["HostConfig"]["ReadonlyRootfs"] is True
    assert owner.attrs["Config"]["User"] == "65534:65534"
    assert "@sha256:" in owner.attrs["Config"]["Image"]  # the pause image, pinned
    assert list(owner.attrs["NetworkSettings"]["Networks"]) == [POOL_NETWORK]

    runtime.remove(container)
    assert not runtime.client.containers.list(all=True, filters={"name": owner.name})


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["none", "pool"])
def test_no_network_and_an_empty_allow_list_reach_nothing(
    runtime, test_image, workdir, servers, gateway, mode
):
    a = assignment(test_image, fetch_both(gateway, servers), mode=mode)
    _, logs = run(runtime, a, workdir)
    assert "hello from" not in logs
    assert "rc1=" in logs and "rc2=" in logs
    assert "rc1=0" not in logs and "rc2=0" not in logs


@pytest.mark.docker
def test_ports_are_published_on_the_network_owner(runtime, test_image, workdir):
    a = assignment(test_image, ["sleep", "30"], ports=[8080])
    runtime.pull(a)
    container = runtime.create(a, workdir)
    runtime.start(container)
    container.reload()
    ports = runtime.ports(container)
    assert set(ports) == {"8080"} and ports["8080"] > 0


@pytest.mark.docker
def test_an_orphaned_network_owner_is_removed_on_reconcile(runtime, test_image, workdir):
    a = assignment(test_image, ["sleep", "30"])
    runtime.pull(a)
    container = runtime.create(a, workdir)
    owner_name = container.name + OWNER_SUFFIX
    container.remove(force=True)  # the job container is gone, its owner is left
    found = runtime.find()
    assert all(f.job != a.job for f in found)  # an owner is never a run
    assert not runtime.client.containers.list(all=True, filters={"name": owner_name})


@pytest.mark.docker
def test_a_node_without_iptables_refuses_pool_jobs(
    runtime, test_image, workdir, tmp_path, monkeypatch
):
    a = assignment(test_image, ["true"], allow=["127.0.0.1:80"])
    runtime.pull(a)
    tools = tmp_path / "bin"  # a node where nsenter and iptables are missing (not mkfs, mount)
    tools.mkdir()
    for tool in disks.TOOLS:
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, workdir)
    assert failure.value.reason == "runtime_error"
    assert "egress cannot be enforced on this node" in failure.value.message
    name = runtime.container_name(a)
    assert not runtime.client.containers.list(all=True, filters={"name": name})
    monkeypatch.undo()
    # Mode none needs nothing of it.
    monkeypatch.setenv("PATH", str(tools))
    runtime.create(assignment(test_image, ["true"], mode="none"), workdir)


def test_the_process_runtime_refuses_an_allow_list(tmp_path):
    runtime = ProcessRuntime(make_owner(), tmp_path)
    no_disk = {"output_limit_mib": 0}  # what it cannot bound it is never asked for
    a = assignment("x", ["true"], allow=["pypi.org:443"], limits=no_disk)
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, tmp_path)
    assert failure.value.reason == "runtime_error"
    assert "egress cannot be enforced on this node" in failure.value.message
    runtime.create(assignment("x", ["true"], mode="none", limits=no_disk), tmp_path)  # runs


def test_the_rules_allow_loopback_replies_dns_and_the_list_then_reject():
    allowed = netpolicy.resolve(["10.1.2.3:8443", "10.1.2.4"], netpolicy.Bounds(True))
    rules = netpolicy.rules(allowed, ["192.0.2.53"])
    assert rules[0] == ["-o", "lo", "-j", "ACCEPT"]
    assert "ESTABLISHED,RELATED" in rules[1]
    assert ["-d", "127.0.0.11", "-p", "udp", "--dport", "53", "-j", "ACCEPT"] in rules
    assert ["-d", "192.0.2.53", "-p", "tcp", "--dport", "53", "-j", "ACCEPT"] in rules
    assert ["-d", "10.1.2.3", "-p", "tcp", "--dport", "8443", "-j", "ACCEPT"] in rules
    assert ["-d", "10.1.2.4", "-j", "ACCEPT"] in rules
    assert rules[-1] == ["-j", "REJECT"]
    with pytest.raises(netpolicy.EgressError, match="IPv4 only"):
        netpolicy.resolve(["[::1]:80"])
