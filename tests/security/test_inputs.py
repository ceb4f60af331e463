"""Issue 17: a job's inputs never make the agent reach what the job may not (SSRF).

At submit, an input naming a refused address is a 400 on `inputs` → index → `url`. On the node
the agent resolves each URL, checks every address it finds (and every redirect's), connects only
to a checked one, and fetches inside the job's own network namespace: a server the job's egress
does not allow is out of reach of the fetch too, though the host itself could reach it. Real
API, real Docker engine, real HTTP servers in a network namespace of the test's own."""

from __future__ import annotations

import socket
from dataclasses import replace
from http.server import BaseHTTPRequestHandler

import pytest
from django.test import override_settings

from config.builders import pinned_test_image, set_pool_knobs, submit_job
from jobs import networks
from jobs.assignments import node_assignments
from leases.choices import LeaseState
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client
from tests.worker_agent.conftest import IDS, make_owner, require_service, test_image
from tests.worker_agent.netns import Netns, available, stable_addresses
from worker_agent import addresses
from worker_agent.inputs import Fetcher
from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import INPUTS_SUFFIX, DockerRuntime, GVisorRuntime
from worker_agent.runtime.process import ProcessRuntime

__all__ = ["test_image"]  # a fixture of the agent's tests, used here
API = "http://127.0.0.1:8000"  # where the agent's control plane is (refused as an input)
STORE = "http://127.0.0.1:9000"


def submit(client, inputs, **overrides):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "fetch",
        "shape": "cpu-small",
        "image": pinned_test_image(),
        "command": ["true"],
        "inputs": inputs,
    } | overrides
    if "resources" in overrides:
        del body["shape"]
    return client.post("/api/v1/jobs/", body, format="json")


def docker_gateway() -> str:
    import ipaddress

    import docker

    client = docker.from_env(timeout=10)
    try:
        config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    finally:
        client.close()
    # the engine leaves Gateway out of the default bridge's config: its first address
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


# ------------------------------------------------------------------ at submit

REFUSED_URLS = [
    "http://127.0.0.1:8000/api/v1/agent/assignments",
    "http://127.1/x",
    "http://2130706433/x",  # 127.0.0.1 as one number
    "http://0x7f.0.0.1/x",
    "http://[::1]/x",
    "http://[::ffff:127.0.0.1]/x",
    "http://localhost:9000/x",
    "http://api.localhost/x",
    "http://169.254.169.254/latest/meta-data/iam",
    "http://[fe80::1]/x",
    "http://[::ffff:169.254.169.254]/x",
    "http://0.0.0.0/x",
    "http://10.0.0.5/x",  # private: the pool does not allow it
    "http://192.168.1.1/x",
    "http://[fd00::5]/x",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_an_input_naming_a_refused_address_is_a_400_on_its_url(api, member, cpu_shape, url):
    response = submit(api(member), ["https://example.org/ok.csv", url])
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]["inputs"]
    assert set(errors) == {"1"} and errors["1"]["url"], errors


def test_private_ranges_only_where_the_pool_allows_them(api, member, pool, cpu_shape):
    assert submit(api(member), ["http://10.0.0.5/data.csv"]).status_code == 400
    set_pool_knobs(pool, private_ranges_allowed=True)
    assert submit(api(member), ["http://10.0.0.5/data.csv"]).status_code == 201
    # loopback and metadata stay refused whatever the pool says
    assert submit(api(member), ["http://169.254.169.254/x"]).status_code == 400
    assert submit(api(member), ["http://127.0.0.1/x"]).status_code == 400


def test_the_control_planes_own_addresses_and_the_docker_gateway_are_refused(
    api, member, pool, cpu_shape
):
    set_pool_knobs(
        pool, private_ranges_allowed=True
    )  # refused as the control plane's, not as private
    own = [str(address) for address in stable_addresses()]
    assert docker_gateway() in own  # the engine's bridge is on this machine here
    for address in {docker_gateway(), *own}:
        host = f"[{address}]" if ":" in address else address
        response = submit(api(member), [f"http://{host}:8000/x"])
        assert response.status_code == 400, (address, response.json())
        assert "always refused" in str(response.json()["errors"]["inputs"]["0"]["url"])


def test_a_nodes_route_address_is_refused(agent, tenant, member, api, cpu_shape):
    """What the control plane knows of its nodes: the addresses their routes were on."""
    node_api = bearer_client(agent.secret)
    job = submit_job(agent.node.pool, tenant, ports=[8080])
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    lease = job.leases.get(state=LeaseState.RESERVED)
    route = {"host": "203.0.113.77", "ports": {"8080": 32768}}
    for step, extra in (("pulling", {}), ("starting", {}), ("running", {"route": route})):
        body = {"fencing_token": str(lease.fencing_token), "step": step, **extra}
        answer = node_api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
        assert answer.status_code == 200, answer.json()
    resources = {"cpu_millicores_min": 100, "memory_mib_min": 64}
    response = submit(
        api(member), ["http://203.0.113.77:8080/x"], pool=agent.node.pool.slug, resources=resources
    )
    assert response.status_code == 400
    assert "a node's address" in str(response.json()["errors"]["inputs"]["0"]["url"])


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_a_tenant_cannot_type_or_mark_a_presigned_object_store_url(api, member, cpu_shape):
    typed = submit(api(member), [f"{STORE}/bucket/weights.bin?X-Amz-Signature=forged"])
    assert typed.status_code == 400
    assert "loopback" in str(typed.json()["errors"]["inputs"]["0"]["url"])
    marked = submit(api(member), [{"url": f"{STORE}/bucket/w.bin", "name": "w", "presigned": True}])
    assert marked.status_code == 400 and "inputs" in marked.json()["errors"]


@override_settings(OBJECT_STORE_ENDPOINTS=[STORE])
def test_only_the_control_plane_marks_presigned_inputs_and_only_on_its_endpoints():
    made = networks.presigned_input(f"{STORE}/bucket/w.bin?sig=1", "w.bin")
    assert made == {"url": f"{STORE}/bucket/w.bin?sig=1", "name": "w.bin", "presigned": True}
    with pytest.raises(ValueError):
        networks.presigned_input("http://127.0.0.1:9001/bucket/w.bin", "w.bin")
    # an assignment keeps the mark only for an endpoint registered now
    stale = {"url": "http://127.0.0.1:9001/b/w", "name": "w", "presigned": True}
    assert networks.assignment_inputs([made, stale]) == [made, {"url": stale["url"], "name": "w"}]
    with override_settings(OBJECT_STORE_ENDPOINTS=[]):
        assert networks.assignment_inputs([made]) == [{"url": made["url"], "name": "w.bin"}]


def test_the_assignment_carries_the_pools_network_rules(agent, tenant):
    set_pool_knobs(agent.node.pool, private_ranges_allowed=True, egress_allowed=["pypi.org"])
    job = submit_job(agent.node.pool, tenant, inputs=[{"url": "http://10.0.0.5/x", "name": "x"}])
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    [entry] = node_assignments(node=agent.node)
    network = entry["pool_network"]
    assert network["private_ranges_allowed"] is True and network["egress_allowed"] == ["pypi.org"]
    assert network["ingress_address"] == "node"
    assert "127.0.0.1/32" in network["refused"]  # the control plane's own addresses
    assert entry["inputs"] == [{"url": "http://10.0.0.5/x", "name": "x"}]


# ------------------------------------------------------------------ on the node


class Files(BaseHTTPRequestHandler):
    """GET /data → a body; /to?u → a redirect to u; every request path recorded."""

    seen: list[str] = []

    def do_GET(self):
        Files.seen.append(f"{self.server.server_address[0]}{self.path}")
        if self.path.startswith("/to?"):
            self.send_response(302)
            self.send_header("Location", self.path[4:])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"input-bytes\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def space():
    require_service(available() is None, f"a network namespace of our own ({available()})")
    netns = Netns(private=True)
    yield netns
    netns.close()


@pytest.fixture(scope="module")
def port(space):
    return space.serve(Files)


@pytest.fixture(scope="module")
def private_port(space):
    return space.serve(Files, space.private)


@pytest.fixture
def runtime(docker_client):
    runtime = DockerRuntime(make_owner("test-node-inputs"), client=docker_client)
    runtime.created = []
    yield runtime
    for container in runtime.created:
        runtime.remove(container)


@pytest.fixture
def workdir(tmp_path):
    for name in ("outputs", "inputs"):
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(0o777)
    return tmp_path


def job(image, urls, mode="none", allow=(), stop_grace_s=10, **pool_network) -> Assignment:
    number = next(IDS)
    return Assignment.parse(
        {
            "stop_grace_s": stop_grace_s,
            "job": number,
            "lease": number + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["cat", "/inputs/data"],
            "inputs": [u if isinstance(u, dict) else {"url": u, "name": "data"} for u in urls],
            "network_policy": {"mode": mode, "egress_allow": list(allow)},
            "pool_network": {"egress_allowed": ["198.18.0.0/15"]} | pool_network,
            # a Docker job always has an /outputs filesystem of its size (runtime/disks.py)
            "limits": {"cpu_millicores": 200, "memory_mib": 32, "pids": 32, "output_limit_mib": 16},
        }
    )


def process_job(urls, **fields) -> Assignment:
    """A job for the process runtime, which has no disk limits to give (output_limit_mib 0)."""
    a = job("x", urls, **fields)
    return replace(a, limits=replace(a.limits, output_limit_mib=0))


def create(runtime, a, workdir):
    runtime.pull(a)
    container = runtime.create(a, workdir, Fetcher.for_attempt(a, workdir, API))
    runtime.created.append(container)
    return container


def refused(runtime, a, workdir) -> str:
    with pytest.raises(RuntimeFailure) as failure:
        create(runtime, a, workdir)
    assert failure.value.reason == "runtime_error"
    assert not (workdir / "inputs" / "data").exists()
    name = runtime.container_name(a)
    for leftover in (name, name + "-net", name + INPUTS_SUFFIX):
        assert not runtime.client.containers.list(all=True, filters={"name": f"^/{leftover}$"})
    return failure.value.message


@pytest.mark.docker
def test_a_job_without_a_network_gets_its_inputs_in_a_throwaway_namespace(
    runtime, test_image, workdir, space, port
):
    a = job(test_image, [f"http://{space.address}:{port}/data"])
    container = create(runtime, a, workdir)
    assert (workdir / "inputs" / "data").read_bytes() == b"input-bytes\n"
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    name = runtime.container_name(a) + INPUTS_SUFFIX  # the fetch's namespace is gone
    assert not runtime.client.containers.list(all=True, filters={"name": name})


@pytest.mark.docker
def test_the_fetch_happens_in_the_jobs_namespace_under_its_egress(
    runtime, test_image, workdir, space, port
):
    """The server is on an address the host reaches (the old agent fetched it from there); the
    job's egress allows another port only, so its inputs cannot come from this one."""
    url = f"http://{space.address}:{port}/data"
    with socket.create_connection((space.address, port), timeout=3):
        pass  # reachable from the node's own namespace
    a = job(test_image, [url], mode="pool", allow=[f"{space.address}:1"])
    message = refused(runtime, a, workdir)
    assert "refused" in message.lower(), message
    allowed = job(test_image, [url], mode="pool", allow=[f"{space.address}:{port}"])
    create(runtime, allowed, workdir)
    assert (workdir / "inputs" / "data").read_bytes() == b"input-bytes\n"


@pytest.mark.docker
def test_a_name_that_resolves_to_the_node_is_refused_after_the_lookup(
    runtime, test_image, workdir, space, port
):
    """The node's own host name passes every check of the name and resolves to the loopback or
    to the node's own address: both refused once resolved, in a namespace and without one."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, port)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    url = f"http://{name}:{port}/data"
    assert addresses.host_refusal(name) is None and addresses.ip_literal(name) is None
    message = refused(runtime, job(test_image, [url]), workdir)
    assert "always refused" in message, message
    # the process runtime fetches from the node's namespace: the fetch's own check refuses it
    process = ProcessRuntime("n", workdir)
    a = process_job([url])
    with pytest.raises(RuntimeFailure) as failure:
        process.create(a, workdir, Fetcher.for_attempt(a, workdir, API))
    assert f"{name} →" in failure.value.message and "always refused" in failure.value.message


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:{port}/x",
        "http://{host}:{port}/x",
    ],
)
def test_a_redirect_to_a_refused_address_is_refused(workdir, space, port, target):
    """The input server answers with a redirect to the metadata endpoint, the loopback or the
    node's own address (the host side of the test's veth): the fetch stops there."""
    target = target.format(host=space.host, port=port)
    Files.seen.clear()
    url = f"http://{space.address}:{port}/to?{target}"
    process = ProcessRuntime("n", workdir)  # no namespace: only the fetch's own check stands
    a = process_job([url])
    with pytest.raises(RuntimeFailure) as failure:
        process.create(a, workdir, Fetcher.for_attempt(a, workdir, API))
    assert "always refused" in failure.value.message, failure.value.message
    assert Files.seen == [f"{space.address}/to?{target}"]  # the redirect was not followed
    # and a redirect to an allowed place is followed
    ok = process_job([f"http://{space.address}:{port}/to?http://{space.address}:{port}/data"])
    process.create(ok, workdir, Fetcher.for_attempt(ok, workdir, API))
    assert (workdir / "inputs" / "data").read_bytes() == b"input-bytes\n"


@pytest.mark.docker
def test_private_ranges_are_fetched_only_where_the_pool_allows_them(
    runtime, test_image, workdir, space, private_port
):
    url = f"http://{space.private}:{private_port}/data"
    message = refused(runtime, job(test_image, [url]), workdir)
    assert "private range" in message, message
    create(runtime, job(test_image, [url], private_ranges_allowed=True), workdir)
    assert (workdir / "inputs" / "data").read_bytes() == b"input-bytes\n"


def test_only_presigned_inputs_on_a_registered_store_pass_the_loopback(tmp_path):
    """The object store listens on the loopback (as the storage issue's test server will)."""
    import threading
    from http.server import ThreadingHTTPServer

    store = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=store.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{store.server_port}"
    url = f"{endpoint}/bucket/data?X-Amz-Signature=1"
    try:
        for name in ("inputs", "outputs"):
            (tmp_path / name).mkdir()
        process = ProcessRuntime("n", tmp_path)
        cases = [
            ({"url": url, "name": "data", "presigned": True}, [endpoint], True),
            ({"url": url, "name": "data"}, [endpoint], False),  # typed by a tenant
            ({"url": url, "name": "data", "presigned": True}, [], False),  # no such store
            ({"url": url, "name": "data", "presigned": True}, ["http://127.0.0.1:1"], False),
        ]
        for item, endpoints, fetched in cases:
            (tmp_path / "inputs" / "data").unlink(missing_ok=True)
            a = process_job([item], object_store_endpoints=endpoints)
            fetcher = Fetcher.for_attempt(a, tmp_path, API)
            if fetched:
                process.create(a, tmp_path, fetcher)
                assert (tmp_path / "inputs" / "data").read_bytes() == b"input-bytes\n"
            else:
                with pytest.raises(RuntimeFailure, match="loopback: always refused"):
                    process.create(a, tmp_path, fetcher)
    finally:
        store.shutdown()
        store.server_close()


@pytest.mark.docker
def test_the_runner_fetches_in_the_throwaway_namespace(docker_client, test_image, tmp_path, space):
    """Through the agent's runner: the throwaway namespace of a job without a network allows
    the input's own host and port only, so a redirect to another port of the same server (which
    the node itself reaches) fails; the plain input arrives."""
    from tests.worker_agent.control_plane import ControlPlane
    from worker_agent.client import ApiClient
    from worker_agent.runner import Runner
    from worker_agent.state import AgentState
    from worker_agent.workroot import WorkRoot

    first, second = space.serve(Files), space.serve(Files)
    plane = ControlPlane()
    try:
        state = AgentState(tmp_path / "state")
        state.save_credential({"credential": plane.credential})
        client = ApiClient(plane.url, state, backoff=0.01)
        runtime = DockerRuntime(make_owner("test-node-runner"), client=docker_client)
        ends = {}
        cases = (("plain", "/data"), ("redirect", f"/to?http://{space.address}:{second}/data"))
        for case, path in cases:
            a = job(test_image, [f"http://{space.address}:{first}{path}"], stop_grace_s=1)
            runner = Runner(
                a,
                client=client,
                runtime=runtime,
                workdir=WorkRoot(tmp_path / "work", state.dir).attempt_dir(a.job, 1),
            )
            runner.poll_s = 0.2
            runner.start()
            runner.join(60)
            ends[case] = plane.reports(a.job)[-1]
        assert ends["plain"]["step"] == "succeeded", ends
        assert ends["redirect"]["step"] == "failed", ends
        assert "refused" in ends["redirect"]["message"].lower(), ends
    finally:
        plane.close()


@pytest.mark.docker
@pytest.mark.parametrize(
    ("mode", "engine_runtime"), [("none", "runsc-none"), ("pool", "runsc-netns")]
)
def test_a_gvisor_job_gets_its_inputs_the_same_way(
    docker_client, test_image, workdir, space, port, mode, engine_runtime
):
    """The fetch is the runtime's, before the sandbox starts: under gVisor too, in the job's own
    (or a throwaway) namespace, and the sandboxed job reads the file."""
    require_service(GVisorRuntime.available(), "gVisor's runsc runtimes in dockerd")
    runtime = GVisorRuntime(make_owner("test-node-inputs"), client=docker_client)
    runtime.created = []
    a = job(test_image, [f"http://{space.address}:{port}/data"], mode=mode)
    if mode == "pool":
        a = replace(a, egress_allow=(f"{space.address}:{port}",))
    # gVisor's own threads count against pids too; every Docker job has an output limit
    a = replace(a, limits=replace(a.limits, pids=1024, output_limit_mib=16))
    try:
        container = create(runtime, a, workdir)
        assert container.attrs["HostConfig"]["Runtime"] == engine_runtime
        runtime.start(container)
        ended = runtime.wait(container, timeout=30)
        assert ended is not None, "the job did not end"
        assert ended.exit_code == 0 and container.logs() == b"input-bytes\n"
    finally:
        for container in runtime.created:
            runtime.remove(container)
