"""POST /api/v1/jobs with the data plane's fields: what is accepted, stored and shown, and every
bad value refused with a 400 naming its field (never a 500)."""

import datetime

import pytest
from django.utils import timezone

from config.builders import build_secret, pinned_test_image, set_pool_knobs, submit_job
from jobs.models import Job
from leases.services.usage import leases_record_usage
from pools.actors import Actor
from scheduling.passes import queued_jobs, scheduling_pass
from tests.clients import bearer_client


def submit(client, **overrides):
    body = {
        "tenant": "vision",
        "pool": "test",
        "name": "train",
        "shape": "cpu-small",
        "image": pinned_test_image(),
        "command": ["sh", "-c", "echo hello > /outputs/greeting.txt"],
    } | overrides
    return client.post("/api/v1/jobs/", body, format="json")


def test_the_full_contract_is_stored_and_shown_with_secret_names_only(
    api, member, tenant, pool, cpu_shape
):
    build_secret(tenant, "hf-token", "hf_do_not_show_me")
    allowed = ["pypi.org", "10.0.0.0/8", "2001:db8::/32"]
    set_pool_knobs(pool, private_ranges_allowed=True, egress_allowed=allowed)
    response = submit(
        api(member),
        env={"MODE": "fast"},
        secrets={"HF_TOKEN": "hf-token"},
        inputs=[
            "https://data.example.org/sets/train%20set.csv?sig=1",
            {"url": "http://10.0.0.5:8080/x", "name": "weights.bin"},
        ],
        ports=[8080, 9090],
        network_policy={
            "mode": "pool",
            "egress_allow": ["pypi.org:443", "10.0.0.5", "[2001:db8::1]:80"],
        },
        retry_policy={"max_attempts": 3, "retry_on": ["node_lost", "oom_killed"]},
        output_destination="",
        max_runtime_s=600,
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["secrets"] == {"HF_TOKEN": "hf-token"}
    assert body["inputs"] == [
        {"url": "https://data.example.org/sets/train%20set.csv?sig=1", "name": "train set.csv"},
        {"url": "http://10.0.0.5:8080/x", "name": "weights.bin"},
    ]
    assert body["ports"] == [8080, 9090]
    assert body["network_policy"]["egress_allow"] == [
        "pypi.org:443",
        "10.0.0.5",
        "[2001:db8::1]:80",
    ]
    # keys left out keep their defaults
    assert body["retry_policy"] == {
        "max_attempts": 3,
        "backoff_s": 30,
        "retry_on": ["node_lost", "oom_killed"],
    }
    assert body["image"] == body["image_requested"] == pinned_test_image()
    assert body["usage"] == {"peak": {}, "average": {}}
    assert body["route"] == {} and body["not_before"] is None
    assert "hf_do_not_show_me" not in response.content.decode()
    listing = api(member).get("/api/v1/jobs/").content.decode()
    assert "hf-token" in listing and "hf_do_not_show_me" not in listing


def test_defaults_when_the_fields_are_left_out(api, member, cpu_shape):
    response = submit(api(member))
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.secrets == {} and job.inputs == [] and job.ports == []
    assert job.network_policy == {"mode": "none", "egress_allow": []}
    assert job.retry_policy == {"max_attempts": 1, "backoff_s": 30, "retry_on": ["node_lost"]}
    assert job.output_destination == ""


def test_a_secret_the_tenant_does_not_have_is_named_in_the_error(
    api, member, tenant, other_tenant, cpu_shape
):
    build_secret(tenant, "present")
    build_secret(other_tenant, "theirs")  # another tenant's secret is not usable
    response = submit(api(member), secrets={"A": "present", "B": "theirs"})
    assert response.status_code == 400
    assert "'theirs'" in str(response.json()["secrets"])
    assert not Job.objects.exists()


LONG_URL = "https://example.org/" + "a" * 2100
BAD = [
    ({"secrets": {"1BAD": "x"}}, "secrets"),
    ({"secrets": {"A": "not a slug"}}, "secrets"),
    ({"secrets": ["A"]}, "secrets"),
    ({"secrets": {f"K{i}": "x" for i in range(65)}}, "secrets"),
    ({"env": {"TOKEN": "plain"}, "secrets": {"TOKEN": "x"}}, "secrets"),
    ({"inputs": ["ftp://example.org/data"]}, "inputs"),
    ({"inputs": ["file:///etc/passwd"]}, "inputs"),
    ({"inputs": ["https://example.org/"]}, "inputs"),  # no name to derive
    ({"inputs": [{"url": "https://example.org/a", "name": "../etc/passwd"}]}, "inputs"),
    ({"inputs": [{"url": "https://example.org/a", "name": "a/b"}]}, "inputs"),
    ({"inputs": [{"url": "https://example.org/a", "extra": 1}]}, "inputs"),
    ({"inputs": ["https://example.org/a", "https://example.com/a"]}, "inputs"),  # same name
    ({"inputs": [LONG_URL]}, "inputs"),
    ({"inputs": [f"https://example.org/{i}" for i in range(33)]}, "inputs"),
    ({"inputs": "https://example.org/a"}, "inputs"),
    ({"ports": [0]}, "ports"),
    ({"ports": [65536]}, "ports"),
    ({"ports": [80, 80]}, "ports"),
    ({"ports": [True]}, "ports"),
    ({"ports": ["80"]}, "ports"),
    ({"ports": list(range(1, 18))}, "ports"),
    ({"network_policy": {"mode": "host"}}, "network_policy"),
    ({"network_policy": {"mode": "none", "egress_allow": ["pypi.org"]}}, "network_policy"),
    ({"network_policy": {"mode": "pool", "egress_allow": ["bad host"]}}, "network_policy"),
    ({"network_policy": {"mode": "pool", "egress_allow": ["h:99999"]}}, "network_policy"),
    ({"network_policy": {"mode": "pool", "egress_allow": ["h"] * 65}}, "network_policy"),
    ({"network_policy": {"mode": "pool", "typo": 1}}, "network_policy"),
    ({"retry_policy": {"max_attempts": 0}}, "retry_policy"),
    ({"retry_policy": {"max_attempts": 11}}, "retry_policy"),
    ({"retry_policy": {"backoff_s": -1}}, "retry_policy"),
    ({"retry_policy": {"backoff_s": 86401}}, "retry_policy"),
    ({"retry_policy": {"retry_on": ["cancelled_by_user"]}}, "retry_policy"),
    ({"retry_policy": {"max_attempts": "3"}}, "retry_policy"),
    ({"retry_policy": {"tries": 3}}, "retry_policy"),
    ({"output_destination": "ftp://somewhere"}, "output_destination"),
    ({"output_destination": 5}, "output_destination"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
def test_bad_values_get_a_400_naming_the_field(api, member, tenant, cpu_shape, body, field):
    build_secret(tenant, "x")
    response = submit(api(member), **body)
    assert response.status_code == 400, response.json()
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_an_s3_destination_names_a_bucket_the_tenant_registered(api, member, cpu_shape):
    """(docs/storage.md "Object stores"; the registered case: tests/storage/.)"""
    response = submit(api(member), output_destination="s3://bucket/prefix")
    assert response.status_code == 400
    assert response.json()["output_destination"] == [
        "The tenant has registered no bucket 'bucket' (POST /api/v1/buckets, by a tenant admin)."
    ]
    response = submit(api(member), output_destination="s3://NOT a bucket")
    assert response.status_code == 400 and "bucket name" in response.json()["output_destination"][0]


def test_a_job_waiting_out_its_backoff_is_not_in_the_pass_window(pool, tenant):
    now = timezone.now()
    waiting = submit_job(pool, tenant, "waiting")
    ready = submit_job(pool, tenant, "ready")
    Job.objects.filter(pk=waiting.pk).update(not_before=now + datetime.timedelta(seconds=30))
    assert [row[0] for row in queued_jobs(limit=10, now=now)] == [ready.pk]
    later = now + datetime.timedelta(seconds=31)
    assert {row[0] for row in queued_jobs(limit=10, now=later)} == {waiting.pk, ready.pk}


def test_a_running_job_shows_its_route_and_usage_peak_and_average(agent, tenant, member, api):
    job = submit_job(agent.node.pool, tenant, ports=[8080], actor=Actor.for_user(member))
    assert job.pk in scheduling_pass(pool_id=job.pool_id).placed
    lease = job.leases.get()
    node_api = bearer_client(agent.secret)
    route = {"host": "10.0.0.5", "ports": {"8080": 32768}}
    for step in ("pulling", "starting", "running"):
        body = {"fencing_token": str(lease.fencing_token), "step": step}
        body |= {"route": route} if step == "running" else {}
        response = node_api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
        assert response.status_code == 200, response.json()
    for cpu in (200, 600):
        usage = {"cpu_millicores": cpu, "memory_mib": 100, "gpu_memory_mib": 0}
        leases_record_usage(
            node=agent.node, workloads=[{"lease": lease.pk, "job": job.pk, "usage": usage}]
        )
    shown = api(member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["state"] == "running" and shown["route"] == route
    assert shown["usage"]["peak"]["cpu_millicores"] == 600
    assert shown["usage"]["average"]["cpu_millicores"] == 400
    listed = api(member).get("/api/v1/jobs/").json()["results"][0]
    assert listed["usage"] == shown["usage"]
