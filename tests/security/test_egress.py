"""Issue 17: a tenant cannot open its job's egress by itself.

A job's `egress_allow` lies within the pool's `egress_allowed` knob (CIDRs and host names, empty
by default), and never names an always-refused address (metadata, loopback, the gateway, the
control plane): a 400 at submit. On the node the agent resolves each entry again when it
installs the rules and checks what it finds: a listed name that resolves to the node itself, or
an assignment naming the metadata endpoint, starts nothing. Real API, real Docker engine."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import ValidationError

from config.builders import pinned_test_image, set_pool_knobs
from pools.actors import Actor
from pools.services import policy_version_publish
from tests.worker_agent.conftest import IDS, make_owner, test_image
from tests.worker_agent.netns import stable_addresses
from worker_agent.runtime.base import Assignment, RuntimeFailure
from worker_agent.runtime.docker import OWNER_SUFFIX, DockerRuntime

__all__ = ["test_image"]  # a fixture of the agent's tests, used here


def submit(client, egress, mode="pool"):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "egress",
        "shape": "cpu-small",
        "image": pinned_test_image(),
        "command": ["true"],
        "network_policy": {"mode": mode, "egress_allow": egress},
    }
    return client.post("/api/v1/jobs/", body, format="json")


def refusal(response) -> str:
    assert response.status_code == 400, response.json()
    return str(response.json()["errors"]["network_policy"]["egress_allow"])


def test_an_empty_bound_allows_no_egress(api, member, cpu_shape):
    assert "is not a name the pool's egress_allowed lists" in refusal(
        submit(api(member), ["pypi.org:443"])
    )
    assert "outside the pool's egress_allowed" in refusal(submit(api(member), ["203.0.113.7"]))
    assert submit(api(member), []).status_code == 201  # DNS and replies only


def test_egress_within_the_pools_bound_only(api, member, pool, cpu_shape):
    set_pool_knobs(pool, egress_allowed=["pypi.org", "203.0.113.0/24"])
    ok = submit(api(member), ["pypi.org:443", "PyPI.org.", "203.0.113.7:80", "203.0.113.8"])
    assert ok.status_code == 201, ok.json()
    errors = refusal(submit(api(member), ["pypi.org", "files.pythonhosted.org", "198.51.100.1"]))
    assert "'1'" in errors and "'2'" in errors and "'0'" not in errors


ALWAYS_REFUSED = [
    "169.254.169.254",
    "169.254.169.254:80",
    "[fe80::1]:80",
    "127.0.0.1:5432",
    "[::1]:6379",
    "[::ffff:169.254.169.254]:80",
    "localhost:80",
    "0.0.0.0",
]


@pytest.mark.parametrize("entry", ALWAYS_REFUSED)
def test_always_refused_addresses_are_a_400_even_inside_the_bound(
    api, member, pool, cpu_shape, entry
):
    """A bound that covers everything an operator may list still never opens these."""
    set_pool_knobs(pool, egress_allowed=["0.0.0.0/0", "::/0"])
    assert "always refused" in refusal(submit(api(member), ["203.0.113.7", entry]))


def test_the_gateway_and_the_control_plane_are_refused_even_with_private_ranges(
    api, member, pool, cpu_shape
):
    set_pool_knobs(pool, private_ranges_allowed=True, egress_allowed=["0.0.0.0/0"])
    for address in stable_addresses():  # this machine: the engine's bridges among them
        if address.version == 4:
            errors = refusal(submit(api(member), [f"{address}:80"]))
            assert "always refused" in errors, (address, errors)
    assert submit(api(member), ["10.1.2.3:80"]).status_code == 201  # private, and allowed


@pytest.mark.parametrize(
    "knob",
    [
        ["169.254.0.0/16"],
        ["169.254.169.254"],
        ["127.0.0.0/8"],
        ["::1"],
        ["localhost"],
        ["bad host"],
        "pypi.org",
        [5],
    ],
)
def test_a_bound_that_opens_an_always_refused_range_is_refused(pool, knob):
    current = pool.scheduling_policy.current
    with pytest.raises(ValidationError) as refused:
        policy_version_publish(
            policy=pool.scheduling_policy,
            weights=dict(current.weights),
            knobs={"egress_allowed": knob},
            actor=Actor.system("test"),
        )
    assert "egress_allowed" in str(refused.value)


@pytest.mark.parametrize("value", ["0.0.0.0", "::", "224.0.0.1", "lab.example", 7, ""])
def test_an_ingress_address_is_node_or_one_address(pool, value):
    current = pool.scheduling_policy.current
    with pytest.raises(ValidationError, match="ingress_address"):
        policy_version_publish(
            policy=pool.scheduling_policy,
            weights=dict(current.weights),
            knobs={"ingress_address": value},
            actor=Actor.system("test"),
        )
    for good in ("node", "127.0.0.1", "::1", "198.51.100.4"):
        set_pool_knobs(pool, ingress_address=good)


# ------------------------------------------------------------------ on the node


@pytest.fixture
def runtime(docker_client):
    runtime = DockerRuntime(make_owner("test-node-egress"), client=docker_client)
    yield runtime


def pool_job(image, egress, bound) -> Assignment:
    number = next(IDS)
    return Assignment.parse(
        {
            "job": number,
            "lease": number + 7,
            "fencing_token": "1",
            "image": image,
            "command": ["true"],
            "network_policy": {"mode": "pool", "egress_allow": egress},
            "pool_network": {"egress_allowed": bound},
            # a Docker job always has an /outputs filesystem of its size (runtime/disks.py)
            "limits": {"cpu_millicores": 200, "memory_mib": 32, "pids": 32, "output_limit_mib": 16},
        }
    )


def starts_nothing(runtime, a, workdir) -> str:
    runtime.pull(a)
    with pytest.raises(RuntimeFailure) as failure:
        runtime.create(a, workdir)
    assert failure.value.reason == "runtime_error"
    name = runtime.container_name(a)
    for leftover in (name, name + OWNER_SUFFIX):
        assert not runtime.client.containers.list(all=True, filters={"name": f"^/{leftover}$"})
    return failure.value.message


@pytest.mark.docker
def test_a_listed_name_that_resolves_to_the_node_is_refused_when_the_rules_are_installed(
    runtime, test_image, tmp_path
):
    """The name passes at submit (it is listed by name); on the node it resolves to the
    loopback or the node's own address, so the job starts nothing."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, 80, socket.AF_INET)
    except OSError:
        pytest.skip(f"this machine's name {name!r} does not resolve")
    message = starts_nothing(runtime, pool_job(test_image, [f"{name}:80"], [name]), tmp_path)
    assert "always refused" in message, message


@pytest.mark.docker
@pytest.mark.parametrize("entry", ["169.254.169.254:80", "203.0.113.9:80"])
def test_the_agent_checks_the_assignment_again(runtime, test_image, tmp_path, entry):
    """An assignment from a control plane that let these through (an old one): the metadata
    endpoint is always refused, and an address outside the pool's bound is too."""
    a = pool_job(test_image, [entry], ["0.0.0.0/1", "128.0.0.0/2"])  # 169.254 in, 203 out
    message = starts_nothing(runtime, a, tmp_path)
    assert "refused" in message, message
