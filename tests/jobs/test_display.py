"""The console's wording of a job's figures (jobs/display.py): what a person reads on the
dashboard's bars, a job's page and the submit form prefilled by Resubmit / Clone."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from django.http import QueryDict

from jobs.display import clone_values, command_line, cores, duration, gib, gpus, job_durations
from jobs.forms import submit_body
from jobs.trace import RUNNING, SCHEDULING, Span

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


# --- units ------------------------------------------------------------------------------------


def test_cores_read_as_a_person_says_them():
    assert f"{cores(2500)} of {cores(4000)}" == "2.5 cores of 4 cores"
    assert cores(1000) == "1 core"
    assert cores(100) == "0.1 cores"
    assert cores(1234) == "1.23 cores"  # two decimals at most
    assert cores(0) == "0 cores"
    assert cores(None) == "—"


def test_memory_is_mib_below_a_gib_and_gib_above():
    assert gib(512) == "512 MiB"
    assert gib(1024) == "1 GiB"
    assert f"{gib(1536)} of {gib(8192)}" == "1.5 GiB of 8 GiB"
    assert gib(1000.4) == "1000 MiB"
    assert gib(None) == "—"


def test_gpus_singular_up_to_one_plural_above_and_for_none():
    assert gpus(2000) == "2 GPUs"
    assert gpus(1000) == "1 GPU"
    assert gpus(500) == "0.5 GPU"
    assert gpus(0) == "0 GPUs"
    assert gpus(None) == "—"


def test_durations_keep_their_two_largest_units():
    assert duration(4000) == "1 h 6 min"
    assert duration(75) == "1 min 15 s"
    assert duration(9.4) == "9 s"
    assert duration(0) == "0 s"
    assert duration(90061) == "1 d 1 h"
    assert duration(3600) == "1 h 0 min"
    assert duration(-5) == "0 s"  # a clock skew never shows as a negative time
    assert duration(None) == "—"


# --- a run's durations from its trace ---------------------------------------------------------


def span(name, start_min, end_min=None):
    end = None if end_min is None else NOW + timedelta(minutes=end_min)
    return Span(name, "s", "p", NOW + timedelta(minutes=start_min), end)


def test_queued_and_ran_add_up_every_attempt_and_the_runtime_left_counts_down():
    spans = [
        span(SCHEDULING, -60, -50),  # queued 10 min
        span(RUNNING, -50, -40),  # ran 10 min, lost
        span(SCHEDULING, -40, -35),  # queued again 5 min
        span(RUNNING, -5),  # running for 5 min now
    ]
    got = job_durations(spans, max_runtime_s=3600, ended=False, now=NOW)
    assert (duration(got["queued_s"]), duration(got["ran_s"])) == ("15 min 0 s", "15 min 0 s")
    assert duration(got["left_s"]) == "55 min 0 s"  # per attempt: 60 min less this one's 5


def test_an_ended_job_has_no_runtime_left_and_an_overrun_shows_none_left():
    spans = [span(SCHEDULING, -10, -9), span(RUNNING, -9, -1)]
    assert job_durations(spans, max_runtime_s=60, ended=True, now=NOW)["left_s"] is None
    overrun = job_durations([span(RUNNING, -5)], max_runtime_s=60, ended=False, now=NOW)
    assert overrun["left_s"] == 0.0
    assert job_durations([], max_runtime_s=60, ended=False, now=NOW) == {
        "queued_s": 0.0,
        "ran_s": 0.0,
        "left_s": None,
    }


# --- the command line -------------------------------------------------------------------------


def test_the_command_reads_as_a_shell_line_with_spaces_quoted():
    assert command_line(["sh", "-c", "echo a; echo b"]) == "sh -c 'echo a; echo b'"
    assert command_line(["python", "train.py", "--name", "my run"]) == (
        "python train.py --name 'my run'"
    )
    assert command_line(["echo", "it's"]) == "echo 'it'\"'\"'s'"
    assert command_line(["echo", ""]) == "echo ''"
    assert command_line([]) == command_line(None) == ""


# --- Resubmit / Clone -------------------------------------------------------------------------


def a_job(**fields):
    job = {
        "name": "train-7",
        "tenant": SimpleNamespace(slug="vision"),
        "pool": SimpleNamespace(slug="main"),
        "image": "registry.example/train@sha256:" + "a" * 64,
        "image_requested": "registry.example/train:1.2",
        "command": ["python", "train.py", "--note", "first try; no grad clip"],
        "max_runtime_s": 7200,
        "env": {"EPOCHS": "3", "MSG": "a b"},
        "secrets": {"HF_TOKEN": "hf-token"},
        "labels": {"team": "cv"},
        "affinity": {"zone": "a"},
        "affinity_preferred": {},
        "anti_affinity": {},
        "ports": [8080, 9090],
        "inputs": ["https://data.example/a.tar", {"url": "https://data.example/b.tar"}],
        "network_policy": {"mode": "egress", "egress_allow": ["pypi.org", "10.0.0.0/8"]},
        "retry_policy": {
            "max_attempts": 3,
            "backoff_s": 60,
            "retry_on": ["node_lost", "oom_killed"],
        },
        "anti_affinity_scope": "zone",
        "require_numa": True,
        "output_destination": "s3://results/train-7",
        "volumes": [
            {"volume": 12, "path": "/data", "read_only": False},
            {"volume": 13, "path": "/ref:erence", "read_only": True},
        ],
        "reservation_id": None,
        "priority_class_id": 4,
        "priority_class": SimpleNamespace(name="batch"),
        "checkpointable": True,
        "gang": None,
        "shape_id": 2,
        "shape": SimpleNamespace(name="cpu-small"),
        "resources": {"cpu_millicores": 2000, "memory_mib": 4096},
    }
    return SimpleNamespace(**(job | fields))


def resubmitted(values: dict) -> dict:
    """The API body the submit form makes of the prefilled values, posted unchanged."""
    post = QueryDict(mutable=True)
    for key, value in values.items():
        if isinstance(value, list):
            post.setlist(key, value)
        else:
            post[key] = value
    body, errors = submit_body(post)
    assert errors == {}
    return body


def test_a_clone_prefills_the_same_fields_as_the_job_asked_for():
    job = a_job()
    values = clone_values(job)
    assert values["image"] == "registry.example/train:1.2"  # as asked, not the pinned digest
    assert values["command"] == "python train.py --note 'first try; no grad clip'"
    assert values["env"] == "EPOCHS=3\nMSG=a b"
    assert values["secrets"] == "HF_TOKEN=hf-token"  # the reference, never a value
    assert values["ports"] == "8080, 9090"
    assert values["inputs"] == "https://data.example/a.tar\nhttps://data.example/b.tar"
    assert values["volumes"] == "12:/data\n13:/ref:erence:ro"
    assert (values["shape_mode"], values["shape"]) == ("catalogue", "cpu-small")
    assert values["priority_class"] == "batch" and values["checkpointable"] == "on"

    body = resubmitted(values)
    assert body["command"] == job.command  # shlex.split gives back the very list
    assert (body["tenant"], body["pool"], body["name"]) == ("vision", "main", "train-7")
    assert body["max_runtime_s"] == "7200" and body["checkpointable"] is True
    assert body["env"] == job.env and body["secrets"] == job.secrets
    assert body["labels"] == job.labels and body["affinity"] == job.affinity
    assert body["ports"] == job.ports and body["shape"] == "cpu-small"
    assert body["inputs"] == ["https://data.example/a.tar", "https://data.example/b.tar"]
    assert body["network_policy"] == job.network_policy
    assert body["retry_policy"]["max_attempts"] == 3 and body["retry_policy"]["backoff_s"] == 60
    assert body["retry_policy"]["retry_on"] == ["node_lost", "oom_killed"]
    assert body["priority_class"] == "batch"
    assert body["anti_affinity_scope"] == "zone" and body["require_numa"] is True
    assert body["output_destination"] == "s3://results/train-7"
    assert body["volumes"] == job.volumes  # read-only kept, a ':' inside a path too


def test_a_clone_of_a_custom_request_prefills_its_resources_and_gang():
    job = a_job(
        shape_id=None,
        shape=None,
        image_requested="",
        priority_class_id=None,
        checkpointable=False,
        network_policy=None,
        retry_policy=None,
        gang={"name": "allreduce", "size": 4, "topology": "same_zone"},
        resources={
            "cpu_millicores_min": 1500,
            "memory_mib_min": 2048,
            "gpu_models": ["H100", "A100"],
            "gpu_interconnect_required": True,
            "zones": [],
            "warm_image_required": False,
        },
    )
    values = clone_values(job)
    assert values["image"] == job.image  # nothing asked: the image it ran
    assert values["shape_mode"] == "custom"
    assert values["gpu_models"] == "H100, A100"
    assert values["gpu_interconnect_required"] == "on"
    assert "zones" not in values and "warm_image_required" not in values  # empty stays empty
    assert (values["priority_class"], values["checkpointable"]) == ("", "")
    assert (values["network_mode"], values["retry_max_attempts"]) == ("none", "1")

    body = resubmitted(values)
    assert body["resources"] == {
        "cpu_millicores_min": "1500",
        "memory_mib_min": "2048",
        "gpu_models": ["H100", "A100"],
        "gpu_interconnect_required": True,
    }
    assert body["gang"] == {"name": "allreduce", "size": 4, "topology": "same_zone"}
    assert body["network_policy"] == {"mode": "none"}
    assert "priority_class" not in body and body["checkpointable"] is False


def test_a_volume_line_that_is_not_id_colon_path_is_the_volumes_fields_error():
    post = QueryDict(mutable=True)
    post.update({"tenant": "vision", "pool": "main", "name": "x", "volumes": "data:/x"})
    body, errors = submit_body(post)
    assert "volumes" not in body
    assert errors["volumes"] == "Line 1: write <volume id>:<path>, or …:<path>:ro."
