"""What is ephemeral, what persists (jobs/selectors.py `job_storage`, docs/storage.md): the job's
API answer and its lease's say what goes when the attempt ends, what is kept, until when, and
where the outputs are fetched after the lease ended."""

from datetime import timedelta

from django.utils import timezone

from config.builders import SYSTEM, cpu_request, submit_job
from jobs import display, retention, selectors
from jobs.models import Job
from jobs.services import job_cancel
from leases.services import lease_reserve
from storage.models import Volume
from tests.jobs.test_agent_api import place


def iso(value):
    return value.isoformat().replace("+00:00", "Z")


def test_a_job_in_the_control_planes_storage(api, member, pool, tenant):
    retention.retention_set(tenant=tenant, pool=pool, days=5, actor=SYSTEM)
    job = submit_job(pool, tenant, inputs=[{"url": "https://example.com/data", "name": "data"}])
    Job.objects.filter(pk=job.pk).update(resources={**job.resources, "scratch_mib": 256})
    storage = api(member).get(f"/api/v1/jobs/{job.pk}").json()["storage"]
    assert storage["ephemeral"] == [
        "container filesystem (removed with the container)",
        "scratch (256 MiB, deleted on the node when the attempt ends)",
        "inputs (fetched onto the node for each attempt, deleted when it ends)",
        f"/outputs on the node ({job.output_limit_mib} MiB; uploaded when the attempt ends, "
        "then deleted there)",
    ]
    [outputs] = storage["persists"]
    assert outputs == {
        "what": "outputs",
        "where": "control plane",
        "until": None,  # not ended yet: 5 days after it ends
        "retention_days": 5,
        "retention_from": "tenant pool",
        "encrypted": "AES-256-GCM under the tenant's data key",
        "fetch": f"/api/v1/jobs/{job.pk}/outputs/",
    }
    assert storage["lease"] is None

    job = job_cancel(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    ended = api(member).get(f"/api/v1/jobs/{job.pk}").json()["storage"]["persists"][0]
    assert ended["until"] == iso(job.state_changed_at + timedelta(days=5))
    listed = api(member).get("/api/v1/jobs").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [r["storage"]["persists"][0]["until"] for r in rows if r["id"] == job.pk] == [
        ended["until"]
    ]


def test_outputs_in_the_tenants_bucket_and_the_volumes(pool, tenant, ready_node):
    job = submit_job(pool, tenant)
    volume = Volume.objects.create(
        tenant=tenant,
        pool=pool,
        node=ready_node,
        name="datasets",
        size_mib=1024,
        retention_days=14,
        expires_at=timezone.now() + timedelta(days=14),
    )
    Job.objects.filter(pk=job.pk).update(
        output_destination="s3://team-bucket/runs/",
        volumes=[
            {"volume": volume.pk, "path": "/data", "read_only": False},
            {"volume": 987654, "path": "/gone", "read_only": True},
        ],
    )
    storage = selectors.job_storage(Job.objects.get(pk=job.pk))
    outputs, mounted, gone = storage["persists"]
    assert outputs["where"] == outputs["fetch"] == "s3://team-bucket/runs/"
    assert outputs["until"] is None and outputs["listed"] == f"/api/v1/jobs/{job.pk}/outputs/"
    assert mounted == {
        "what": "volume datasets",
        "volume": volume.pk,
        "path": "/data",
        "read_only": False,
        "where": f"node {ready_node.name}",
        "until": iso(volume.expires_at),
        "retention_days": 14,
    }
    assert gone == {"what": "volume 987654", "volume": 987654, "path": "/gone", "read_only": True}


def test_the_lease_says_what_its_job_says(api, member, agent, tenant):
    job, lease = place(submit_job(agent.node.pool, tenant))
    answer = api(member).get(f"/api/v1/compute-leases/{lease.pk}").json()["storage"]
    assert answer == selectors.job_storage(job, lease=lease)
    assert answer["lease"] == {
        "id": lease.pk,
        "ended_at": None,
        "expires_at": iso(lease.expires_at),
    }
    assert answer["persists"][0]["fetch"] == f"/api/v1/jobs/{job.pk}/outputs/"
    # the job's own answer names the same (newest) lease
    assert api(member).get(f"/api/v1/jobs/{job.pk}").json()["storage"] == answer


def test_a_lease_without_a_job_holds_only_capacity(api, member, pool, tenant, ready_node):
    lease = lease_reserve(
        tenant=tenant,
        pool=pool,
        request=cpu_request(cpu=100, memory=64),
        actor=SYSTEM,
        duration=timedelta(minutes=5),
    )
    storage = api(member).get(f"/api/v1/compute-leases/{lease.pk}").json()["storage"]
    assert storage["ephemeral"] == ["container filesystem (removed with the container)"]
    assert storage["persists"] == []


def test_the_page_words_each_kind_of_statement():
    sentences = display.storage_sentences(
        {
            "ephemeral": ["container filesystem (removed with the container)"],
            "persists": [
                {"what": "outputs", "where": "s3://team/runs/", "until": None},
                {
                    "what": "volume datasets",
                    "path": "/data",
                    "read_only": True,
                    "where": "node gpu-1",
                    "until": "2027-01-02T03:04:00Z",
                    "retention_days": 14,
                },
                {"what": "volume 7", "path": "/x", "read_only": False},
                {
                    "what": "outputs",
                    "where": "control plane",
                    "until": None,
                    "retention_days": 30,
                    "fetch": "/api/v1/jobs/1/outputs/",
                },
            ],
            "lease": None,
        }
    )
    assert sentences == [
        "Deleted when an attempt ends: container filesystem (removed with the container).",
        "Outputs go to s3://team/runs/, the tenant's bucket, and are fetched there; the control "
        "plane does not delete them.",
        "The volume datasets (at /data, read-only) persists on node gpu-1 until "
        "2027-01-02 03:04 UTC.",
        "The volume 7 (at /x, read-write) persists.",
        "Outputs are kept in the control plane, encrypted under the tenant's own key, for 30 "
        "days after the job ends; download them here or from /api/v1/jobs/1/outputs/.",
    ]
