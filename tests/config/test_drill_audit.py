"""The drill's audit (config/drill/audit.py) on a real database and a real Docker engine: a
clean run passes with zeros, and each planted fault is caught: an overcommit in the leases'
history, a gap in a job's events, an event a follower never got, a job attempt two nodes
started (by the agents' reports, and by the engine's own container events)."""

import time
import uuid
from types import SimpleNamespace

import docker
import pytest

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, submit_job
from config.drill.audit import EngineEvents, audit, engine_double_runs, recovery
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.models import Job, JobEvent
from jobs.services import job_cancel
from leases.choices import LeaseState
from leases.models import Lease
from pools.actors import Actor
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from tests.web_server import _test_database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
NO_CONTAINERS = {"computepool.control_plane": "none-" + uuid.uuid4().hex}


@pytest.fixture
def run(pool, tenant):
    """Three jobs placed by a pass, then cancelled (their leases end): a clean history."""
    node = build_node(pool, "n1")
    jobs = [submit_job(pool, tenant, f"j{i}", cpu=500) for i in range(3)]
    scheduling_pass()
    assert Job.objects.filter(state=JobState.LEASED).count() == 3
    for job in jobs:
        job_cancel(job=job, actor=SYSTEM)
    return SimpleNamespace(node=node, jobs=jobs)


def followed(tenant) -> list[dict]:
    rows = JobEvent.objects.filter(job__tenant=tenant).order_by("id")
    return [{"cursor": pk} for pk in rows.values_list("id", flat=True)]


def audited(tenant, seen=None) -> dict:
    seen = followed(tenant) if seen is None else seen
    return audit(
        _test_database_url(),
        control_plane_labels=NO_CONTAINERS,
        since=time.time() - 60,
        followers_seen={tenant.slug: seen},
    )


def test_a_clean_run_has_nothing_to_report(run, tenant):
    result = audited(tenant)
    assert result["jobs_by_state"] == {"cancelled": 3}
    assert result["leases_by_state"] == {"released": 3}
    assert result["job_ends_by_reason"] == {"cancelled": {"cancelled_by_user": 3}}
    for name in ("overcommitted_nodes", "jobs_without_terminal_reason", "lost_events"):
        assert result[name] == 0, (name, result["details"])
    assert result["double_runs"] == 0
    assert (
        result["details"]["followers"][tenant.slug]["expected"] == 9
    )  # submitted, placed, cancelled


def test_an_overcommit_in_the_past_is_caught(run, tenant):
    """Every lease is released now; one of them once held more CPU than the node has."""
    lease = Lease.objects.first()
    Lease.objects.filter(pk=lease.pk).update(cpu_millicores=run.node.cpu_millicores_allocatable)
    result = audited(tenant)
    assert result["overcommitted_nodes"] == 1
    assert result["details"]["overcommitted"] == [run.node.pk]


def test_a_gap_in_a_job_history_is_caught(run, tenant):
    job = run.jobs[1]
    job.events.filter(to_state=JobState.LEASED).delete()
    result = audited(tenant, seen=followed(tenant))
    assert result["lost_events"] == 1
    (broken,) = result["details"]["broken_histories"]
    assert broken["job"] == job.pk and "from leased after queued" in broken["problem"]


def test_notes_that_keep_the_state_are_no_broken_history(pool, tenant):
    """The agent reports its image pull as events that keep the job leased (leased → leased,
    docs/data-plane.md "pulling"): a whole history. A second placement is not: it comes from
    queued, after leased."""
    node = build_node(pool, "n1")
    job = submit_job(pool, tenant, "pulls", cpu=500)
    assert job.pk in scheduling_pass(pool_id=pool.pk).placed
    lease = job.leases.get(state=LeaseState.RESERVED)
    agent = Actor.for_node(node)
    for step, extra in [
        ("pulling", {}),
        ("pulling", {"pull_seconds": 1.5}),
        ("starting", {}),
        ("running", {}),
        ("succeeded", {}),
    ]:
        job_report(
            job=job, node=node, fencing_token=lease.fencing_token, step=step, actor=agent, **extra
        )
    history = list(job.events.order_by("id").values_list("from_state", "to_state", "reason"))
    assert history[2:4] == [
        (JobState.LEASED, JobState.LEASED, Reason.IMAGE_PULLING),
        (JobState.LEASED, JobState.LEASED, Reason.IMAGE_PULLED),
    ]
    result = audited(tenant)
    assert result["lost_events"] == 0, result["details"]
    assert result["jobs_by_state"] == {"succeeded": 1} and result["double_runs"] == 0

    JobEvent.record(
        job,
        actor=SYSTEM,
        from_state=JobState.QUEUED,
        to_state=JobState.LEASED,
        reason=Reason.PLACED,
    )
    (broken,) = audited(tenant)["details"]["broken_histories"]
    assert "from queued after succeeded" in broken["problem"]


def test_an_event_a_follower_missed_or_got_twice_is_caught(run, tenant):
    seen = followed(tenant)
    result = audited(tenant, seen=seen[:2] + seen[3:])
    assert result["lost_events"] == 1
    assert result["details"]["followers"][tenant.slug]["missing"] == [seen[2]["cursor"]]
    assert audited(tenant, seen=seen + seen[-1:])["lost_events"] == 1  # a repeat
    assert audited(tenant, seen=[seen[1], seen[0], *seen[2:]])["lost_events"] == 1  # disorder


def test_a_job_still_running_or_ending_without_a_reason_is_caught(run, tenant, pool):
    submit_job(pool, tenant, "never-ran")
    run.jobs[0].events.filter(to_state=JobState.CANCELLED).update(reason="")
    result = audited(tenant)
    assert result["jobs_without_terminal_reason"] == 2
    assert {j["why"] for j in result["details"]["without_terminal_reason"]} == {
        "not final",
        "final event without a reason",
    }


def test_an_attempt_two_nodes_reported_starting_is_a_double_run(pool, tenant):
    first, second = build_node(pool, "n1"), build_node(pool, "n2")
    job = submit_job(pool, tenant, "twice")
    chain = [
        (JobState.QUEUED, JobState.LEASED, SYSTEM, Reason.PLACED),
        (JobState.LEASED, JobState.STARTING, Actor.for_node(first), Reason.STARTUP_BEGAN),
        (JobState.STARTING, JobState.RUNNING, Actor.for_node(second), Reason.CONTAINER_STARTED),
        (JobState.RUNNING, JobState.SUCCEEDED, Actor.for_node(second), Reason.EXITED_ZERO),
    ]
    for from_state, to_state, actor, reason in chain:
        JobEvent.record(job, actor=actor, from_state=from_state, to_state=to_state, reason=reason)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    result = audited(tenant)
    assert result["lost_events"] == 0  # the history itself is whole
    assert result["double_runs"] == 1
    assert result["details"]["double_runs_reported"] == [(job.pk, 1)]


def test_the_engine_events_show_an_attempt_running_on_two_nodes_at_once():
    labels = {"computepool.control_plane": "audit-" + uuid.uuid4().hex[:12]}
    client = docker.from_env()
    since = time.time() - 1

    def container(job: int, node: int, seconds: float):
        return client.containers.run(
            TEST_IMAGE_TAG,
            ["sleep", str(seconds)],
            detach=True,
            labels=labels
            | {
                "computepool.job": str(job),
                "computepool.attempt": "1",
                "computepool.node_id": str(node),
            },
        )

    made = []
    watched = EngineEvents(labels)  # live, as the drill watches (the engine keeps only 256)
    try:
        made += [container(101, 1, 2), container(101, 2, 2)]  # both at once: a double run
        made.append(container(102, 1, 0.1))  # one after the other: not one
        made[-1].wait(timeout=30)
        made.append(container(102, 2, 0.1))
        for c in made:
            c.wait(timeout=30)
        found = engine_double_runs(labels, since, until=time.time() + 1)
        # 300 other events (volumes made and removed) push these out of the engine's history
        for n in range(150):
            client.volumes.create(f"{labels['computepool.control_plane']}-{n}").remove()
        events = watched.stop()
        from_history = engine_double_runs(labels, since, until=time.time() + 1)
        from_watch = engine_double_runs(labels, since, events=events)
    finally:
        watched.stop()
        for c in made:
            c.remove(force=True)
        client.close()
    assert found["containers_started"] == 4
    assert found["double"] == [(101, 1)]
    assert from_history["containers_started"] < 4  # what a query after a long run sees
    assert from_watch == found


def test_recovery_is_measured_from_each_fault_end(run):
    lease_made = Lease.objects.order_by("created_at").first().created_at.timestamp()
    end = lease_made - 2
    load = SimpleNamespace(
        samples=lambda: [(end + 0.5 + i / 10, 0.01 if i > 3 else 2.0, "2xx") for i in range(1000)]
    )
    (figures,) = recovery([{"name": "beat", "ended_at": end}], _test_database_url(), load)
    assert figures["name"] == "beat"
    assert 1.9 <= figures["to_next_placement_s"] <= 2.1
    assert figures["to_p99_s"] == pytest.approx(0.9, abs=0.01)
