"""Every poolctl command against a live server, as a person runs it: tables by default, the
API's JSON with --json, and the API's refusals as exit code 2 with the reason code."""

import hashlib
import io
import json
from pathlib import Path

import pytest

from config.builders import TEST_IMAGE_TAG, pinned_test_image
from jobs import artifacts
from jobs.models import Job, JobOutput
from jobs.services import job_cancel
from leases.models import Lease
from poolctl.commands import unseen
from pools.actors import Actor
from pools.models import Quota
from pools.services import api_token_issue
from tests.poolctl.conftest import Driver, place, report, run_to

pytestmark = pytest.mark.usefixtures("media")

SUBMIT = ["--pool", "test", "--name", "train", "--shape", "cpu-small", "--image", TEST_IMAGE_TAG]


@pytest.fixture
def job_id(poolctl, cpu_shape, ready_node) -> int:
    result = poolctl("submit", *SUBMIT, "--quiet", "--", "sh", "-c", "echo hi")
    assert result.code == 0, result.err
    return int(result.out)


# --- submit ----------------------------------------------------------------------------------


def test_submit_from_flags_pins_the_image_and_prints_the_job(poolctl, cpu_shape):
    result = poolctl("submit", *SUBMIT, "--env", "MODE=fast", "--", "sh", "-c", "echo hi")
    assert result.code == 0, result.err
    job = Job.objects.get()
    assert (job.name, job.tenant.slug, job.pool.slug, job.shape.name) == (
        "train",
        "vision",  # the member's only tenant, asked of GET /me
        "test",
        "cpu-small",
    )
    assert job.command == ["sh", "-c", "echo hi"] and job.env == {"MODE": "fast"}
    assert job.image == pinned_test_image()
    lines = dict(line.split(None, 1) for line in result.out.splitlines() if " " in line)
    assert lines["id"] == str(job.pk) and lines["state"] == "queued"


def test_submit_from_a_yaml_manifest_with_flags_over_it(poolctl, pool, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "tenant: vision\n"
        "pool: test\n"
        "name: from-yaml\n"
        f"image: {TEST_IMAGE_TAG}\n"
        "resources: {cpu_millicores_min: 500, memory_mib_min: 256}\n"
        "command: [echo, hello]\n"
        "labels: {team: a}\n"
    )
    result = poolctl(
        "submit", "-f", manifest, "--name", "renamed", "--label", "stage=test", "--json"
    )
    assert result.code == 0, result.err
    body = result.json
    assert body["name"] == "renamed" and body["command"] == ["echo", "hello"]
    assert body["labels"] == {"team": "a", "stage": "test"}
    assert body["resources"]["cpu_millicores_min"] == 500
    assert Job.objects.get(pk=body["id"]).resources["memory_mib_min"] == 256


def test_submit_from_a_json_manifest_with_inline_resources_from_flags(poolctl, pool, tmp_path):
    manifest = tmp_path / "job.json"
    body = {"pool": "test", "name": "from-json", "image": TEST_IMAGE_TAG, "shape": "nope"}
    manifest.write_text(json.dumps(body))
    result = poolctl("submit", "-f", manifest, "--cpu", 250, "--memory", 128, "--json")
    assert result.code == 0, result.err
    assert result.json["resources"]["cpu_millicores_min"] == 250
    assert result.json["shape"] is None  # the flags' resources replaced the manifest's shape


def test_a_refused_submit_prints_the_field_errors_and_exits_2(poolctl, cpu_shape):
    result = poolctl("submit", *SUBMIT, "--tenant", "nlp")
    assert result.code == 2 and result.out == ""
    assert "refused (400 invalid)" in result.err
    assert "tenant: No tenant of yours has this slug." in result.err
    assert Job.objects.count() == 0


def test_a_manifest_that_is_not_yaml_is_a_usage_error_and_sends_nothing(poolctl, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text("name: [unclosed\n")
    result = poolctl("submit", "-f", manifest)
    assert result.code == 1 and "is not valid YAML" in result.err
    result = poolctl("submit", "--pool", "test")
    assert result.code == 1 and "missing name, image" in result.err
    assert Job.objects.count() == 0


# --- jobs, cancel, events --------------------------------------------------------------------


def test_jobs_as_a_table_as_json_and_one_job(poolctl, job_id, cpu_shape):
    other = poolctl("submit", *SUBMIT, "--name", "second", "--quiet")
    assert other.code == 0
    table = poolctl("jobs")
    assert table.code == 0
    header, *rows = table.out.splitlines()
    assert header.split() == ["ID", "NAME", "TENANT", "POOL", "STATE", "EXIT", "CREATED"]
    assert [row.split()[:5] for row in rows] == [
        [other.out.strip(), "second", "vision", "test", "queued"],
        [str(job_id), "train", "vision", "test", "queued"],
    ]
    listed = poolctl("jobs", "--json", "--limit", 1)
    assert [job["name"] for job in listed.json] == ["second"]
    one = poolctl("jobs", job_id, "--json")
    assert one.json["id"] == job_id and one.json["command"] == ["sh", "-c", "echo hi"]
    assert poolctl("jobs", "--state", "running,succeeded").out.strip() == "(none)"


def test_cancel_then_cancel_again_is_refused_with_its_code(poolctl, job_id):
    result = poolctl("cancel", job_id)
    assert (result.code, result.out) == (0, f"job {job_id} cancelled\n")
    again = poolctl("cancel", job_id)
    assert again.code == 2
    assert "refused (409 transition_not_allowed)" in again.err
    events = poolctl("events", job_id, "--json").json
    assert [event["reason"] for event in events] == ["submitted", "cancelled_by_user"]


def test_a_job_of_another_tenant_is_not_found(poolctl, job_id, outsider, monkeypatch):
    monkeypatch.setenv("POOLCTL_TOKEN", api_token_issue(user=outsider, name="other")[1])
    result = poolctl("jobs", job_id)
    assert result.code == 2 and "refused (404 not_found)" in result.err


# --- watch -----------------------------------------------------------------------------------


def test_watch_follows_the_events_until_success_and_exits_0(poolctl, job_id):
    driver = Driver(lambda: run_to(job_id, "succeeded"))
    driver.start()
    result = poolctl("watch", job_id, "--interval", 0.1)
    driver.join()
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "submitted" in lines[0]
    reasons = ["startup_began", "container_started", "exited_zero"]
    found = [next(i for i, line in enumerate(lines) if reason in line) for reason in reasons]
    assert found == sorted(found)  # in the order they happened, each once
    assert sum("exited_zero" in line for line in lines) == 1
    assert lines[-1] == f"job {job_id} succeeded (exit 0)"


def test_watch_exits_4_when_the_job_fails(poolctl, job_id):
    driver = Driver(lambda: run_to(job_id, "failed", reason="exited_nonzero", exit_code=3))
    driver.start()
    result = poolctl("watch", job_id, "--interval", 0.1, "--json")
    driver.join()
    assert result.code == 4
    events = [json.loads(line) for line in result.out.splitlines()]
    assert events[0]["reason"] == "submitted" and events[-1]["reason"] == "exited_nonzero"
    assert len({event["id"] for event in events}) == len(events)  # nothing twice


def test_watch_exits_4_when_the_job_is_cancelled(poolctl, job_id):
    driver = Driver(lambda: cancel(job_id))
    driver.start()
    result = poolctl("watch", job_id, "--interval", 0.1)
    driver.join()
    assert result.code == 4
    assert result.out.splitlines()[-1] == f"job {job_id} cancelled"


def cancel(job_id):
    job_cancel(job=Job.objects.get(pk=job_id), actor=Actor.system("test"))


# --- logs and outputs ------------------------------------------------------------------------


def test_logs_tail_and_follow_until_the_job_ends(poolctl, job_id):
    job, lease = place(job_id)
    for step in ("pulling", "starting", "running"):
        job = report(job, lease, step)
    artifacts.job_log_append(job=job, attempt=1, text="one\ntwo\nthr")
    assert poolctl("logs", job_id).out == "one\ntwo\nthr"
    assert poolctl("logs", job_id, "--tail", 1).out == "thr"

    def finish():
        artifacts.job_log_append(job=job, attempt=1, text="ee\nfour\n")
        report(job, lease, "succeeded")

    driver = Driver(finish)
    driver.start()
    followed = poolctl("logs", job_id, "-f", "--interval", 0.1)
    driver.join()
    assert followed.code == 0
    assert followed.out == "one\ntwo\nthree\nfour\n"  # the half-written line once, whole


def test_outputs_list_and_get_checked_by_sha256(poolctl, job_id, tmp_path, monkeypatch):
    job, _ = run_to(job_id, "succeeded")
    artifacts.job_output_store(job=job, attempt=1, name="greeting.txt", fileobj=io.BytesIO(b"hi\n"))
    listing = poolctl("outputs", job_id)
    assert listing.code == 0
    assert listing.out.splitlines()[1].split()[:3] == ["greeting.txt", "3", "1"]
    monkeypatch.chdir(tmp_path)
    got = poolctl("outputs", job_id, "--get", "greeting.txt")
    assert got.code == 0 and (tmp_path / "greeting.txt").read_bytes() == b"hi\n"
    assert hashlib.sha256(b"hi\n").hexdigest() in got.err
    again = poolctl("outputs", job_id, "--get", "greeting.txt")
    assert again.code == 1 and "exists" in again.err
    elsewhere = poolctl("outputs", job_id, "--get", "greeting.txt", "-o", tmp_path / "copy")
    assert elsewhere.code == 0 and (tmp_path / "copy").read_bytes() == b"hi\n"
    missing = poolctl("outputs", job_id, "--get", "nope.txt")
    assert missing.code == 2 and "404 not_found" in missing.err
    assert not (tmp_path / "nope.txt").exists() and not (tmp_path / "nope.txt.part").exists()


def test_an_output_that_changed_in_storage_is_not_kept(poolctl, job_id, tmp_path):
    job, _ = run_to(job_id, "succeeded")
    output = artifacts.job_output_store(
        job=job, attempt=1, name="model.bin", fileobj=io.BytesIO(b"weights")
    )
    # sealed at rest (docs/storage.md): an altered file is refused by the server before a byte
    Path(output.file.path).write_bytes(b"rotten!")
    result = poolctl("outputs", job_id, "--get", "model.bin", "-o", tmp_path / "model.bin")
    assert result.code == 2 and "output_unreadable" in result.err
    assert list(tmp_path.glob("model.bin*")) == []
    # an output stored before encryption is served as stored: poolctl's digest check catches it
    JobOutput.objects.filter(pk=output.pk).update(data_key=None)
    result = poolctl("outputs", job_id, "--get", "model.bin", "-o", tmp_path / "model.bin")
    assert result.code == 3
    assert f"the server said {hashlib.sha256(b'weights').hexdigest()}" in result.err
    assert list(tmp_path.glob("model.bin*")) == []


# --- explain, pools, shapes, quota -----------------------------------------------------------


def test_explain_a_waiting_job_then_a_placed_one(poolctl, job_id, ready_node):
    waiting = poolctl("explain", job_id)
    assert waiting.code == 0, waiting.err
    lines = waiting.out.splitlines()
    assert lines[0] == f"job {job_id}: queued"
    assert lines[1].startswith("now: fits on node-1 (score ")
    _, lease = place(job_id)
    placed = poolctl("explain", job_id)
    assert f"placed: lease {lease.pk} on node-1" in placed.out
    assert poolctl("explain", job_id, "--json").json["placement"]["lease"] == lease.pk


def test_explain_says_why_a_job_does_not_fit_now(poolctl, cpu_shape, ready_node):
    hog = poolctl("leases", "reserve", "--pool", "test", "--cpu", 14000, "--memory", 64, "--json")
    assert hog.code == 0, hog.err
    waiting = poolctl("submit", *SUBMIT, "--quiet")
    lines = poolctl("explain", waiting.out.strip()).out.splitlines()
    assert lines[1] == "now: does not fit"
    assert lines[2].startswith("  0 of 1 nodes: 1 insufficient_cpu;")
    assert "  reasons: insufficient_cpu=1" in lines
    assert f"after_leases={hog.json['id']}" in "\n".join(lines)


def test_pools_and_shapes_of_one_pool_or_all(poolctl, cpu_shape):
    assert poolctl("pools").out.splitlines()[1].split()[1] == "test"
    shapes = poolctl("shapes", "test")
    assert shapes.out.splitlines()[0].split()[:5] == ["POOL", "NAME", "CPU(m)", "MEM(MiB)", "GPUS"]
    assert shapes.out.splitlines()[1].split()[:4] == ["test", "cpu-small", "1000", "1024"]
    assert poolctl("shapes", "--json").json[0]["name"] == "cpu-small"
    unknown = poolctl("shapes", "nope")
    assert unknown.code == 2 and "404 not_found" in unknown.err


def test_quota_shows_each_dimension_its_use_and_limit(poolctl, pool, tenant):
    Quota.objects.create(tenant=tenant, pool=pool, cpu_millicores=8000, memory_mib=16384)
    result = poolctl("quota")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("vision in test: no credit limit; period ")
    assert lines[1].split() == ["DIMENSION", "USED", "LIMIT"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["cpu_millicores"] == ["0.0", "8000"]
    assert rows["gpu_hours"][1] == "unlimited"
    assert poolctl("quota", "--json").json[0]["tenant"] == "vision"
    assert poolctl("quota", "--pool", "other").out == "(no quotas: nothing limits your tenants)\n"


# --- leases ----------------------------------------------------------------------------------


def test_lease_round_trip_reserve_commit_renew_release(poolctl, cpu_shape, ready_node):
    reserved = poolctl("leases", "reserve", "--pool", "test", "--shape", "cpu-small", "--json")
    assert reserved.code == 0, reserved.err
    lease, token = reserved.json["id"], reserved.json["fencing_token"]
    assert reserved.json["state"] == "reserved" and reserved.json["node"] == "node-1"

    stale = poolctl("leases", "commit", lease, "--fencing-token", int(token) + 1)
    assert stale.code == 2 and "fencing_token_mismatch" in stale.err
    committed = poolctl("leases", "commit", lease, "--fencing-token", token)
    assert committed.code == 0 and "committed" in committed.out.split()
    renewed = poolctl("leases", "renew", lease, "--fencing-token", token, "--duration", 900)
    assert renewed.code == 0
    assert Lease.objects.get(pk=lease).expires_at > Lease.objects.get(pk=lease).committed_at
    listed = poolctl("leases")
    assert listed.out.splitlines()[1].split()[:5] == [str(lease), "test", "vision", "node-1",
                                                      "committed"]  # fmt: skip
    released = poolctl("leases", "release", lease, "--message", "done", "--json")
    assert released.json["state"] == "released"
    assert poolctl("leases", "show", lease, "--json").json["state"] == "released"
    reasons = [event["reason"] for event in poolctl("leases", "events", lease, "--json").json]
    assert reasons[0] == "reserved" and reasons[-1] == "released_by_client"


def test_a_lease_that_does_not_fit_is_refused_with_the_explanation(poolctl, ready_node):
    result = poolctl("leases", "reserve", "--pool", "test", "--cpu", 64000, "--memory", 64)
    assert result.code == 2 and "refused (422 never_fits)" in result.err


def test_follow_finds_where_a_sliding_tail_overlaps_what_was_printed():
    printed = ["a\n", "b\n", "c\n"]
    assert unseen(printed, "a\nb\nc\nd\n") == (["d\n"], True)  # the whole log, grown
    assert unseen(printed, "b\nc\nd\ne\n") == (["d\n", "e\n"], True)  # the tail slid
    assert unseen(["x\n", "x\n"], "x\nx\nx\n") == (["x\n"], True)  # the longest overlap
    assert unseen(printed, "y\nz\n") == (["y\n", "z\n"], False)  # more came than a tail holds
    assert unseen([], "first") == (["first"], True)


def test_a_reservation_from_the_command_line_runs_the_job_that_names_it(poolctl, ready_node):
    from datetime import timedelta

    from django.utils import timezone

    start = timezone.now() + timedelta(hours=1)
    window = ["--start", start.isoformat(), "--end", (start + timedelta(hours=1)).isoformat()]
    flags = ["--cpu", 2000, "--memory", 2048, "--scratch", 4096, "--tolerance", 120]
    reserved = poolctl("leases", "reserve", "--pool", "test", *window, *flags, "--json")
    assert reserved.code == 0, reserved.err
    lease = reserved.json["id"]
    assert reserved.json["window_start"] and reserved.json["tolerance_s"] == 120
    submitted = poolctl(
        "submit", "--pool", "test", "--name", "in-it", "--image", TEST_IMAGE_TAG,
        "--cpu", 1000, "--memory", 512, "--reservation", lease, "--json",
    )  # fmt: skip
    assert submitted.code == 0, submitted.err
    assert submitted.json["reservation"] == lease
    shown = poolctl("leases", "show", lease)
    assert shown.code == 0
    assert ["jobs", str(submitted.json["id"])] in [line.split() for line in shown.out.splitlines()]
    refused = poolctl(
        "submit", "--pool", "test", "--name", "again", "--image", TEST_IMAGE_TAG,
        "--cpu", 1000, "--memory", 512, "--reservation", lease,
    )  # fmt: skip
    assert refused.code == 2 and "reservation:" in refused.err and "already named" in refused.err


# --- volumes ---------------------------------------------------------------------------------


def test_volumes_are_created_listed_mounted_and_deleted_from_the_command_line(
    poolctl, cpu_shape, ready_node
):
    made = poolctl("volumes", "create", "--pool", "test", "--name", "data", "--size", 64, "--json")
    assert made.code == 0, made.err
    volume = json.loads(made.out)
    assert (volume["node"], volume["size_mib"], volume["state"]) == (
        ready_node.name,
        64,
        "available",
    )
    table = poolctl("volumes")
    assert table.code == 0 and "data" in table.out and str(volume["id"]) in table.out
    # a job mounts it; while that job has not ended the volume cannot go
    job = poolctl("submit", *SUBMIT, "--volume", f"{volume['id']}:/data:ro", "--quiet", "--")
    assert job.code == 0, job.err
    assert Job.objects.get(pk=int(job.out)).volumes == [
        {"volume": volume["id"], "path": "/data", "read_only": True}
    ]
    refused = poolctl("volumes", "delete", volume["id"])
    assert refused.code == 2 and "volume_in_use" in refused.err
    job_cancel(job=Job.objects.get(pk=int(job.out)), actor=Actor.system("test"))
    gone = poolctl("volumes", "delete", volume["id"], "--json")
    assert gone.code == 0 and json.loads(gone.out)["state"] == "deleted"
    events = poolctl("volumes", "events", volume["id"])
    assert "volume_created" in events.out and "volume_deleted" in events.out


def test_a_volume_flag_that_is_not_id_colon_path_is_a_usage_error(poolctl, cpu_shape):
    result = poolctl("submit", *SUBMIT, "--volume", "data:/x", "--", "true")
    assert result.code == 1 and "--volume 'data:/x'" in result.err
    assert not Job.objects.exists()
