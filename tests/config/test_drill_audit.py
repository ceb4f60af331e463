"""The drill's audit (config/drill/audit.py) on a real database and a real Docker engine: a
clean run passes with zeros, and each planted fault is caught: an overcommit in the leases'
history (backfills included), a gap in a job's events, an event a follower never got, a job
attempt two nodes started (by the agents' reports), a job two of whose containers ran at once
(by the engine's own container events), a job that ran unseen by the engine watch, a watch
that broke; and recovery is measured to the next pass placement and the baseline p99."""

import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import docker
import pytest
from django.utils import timezone

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, cpu_request, submit_job
from config.drill.audit import EngineEvents, audit, engine_double_runs, recovery
from jobs.choices import JobState
from jobs.lifecycle import job_report
from jobs.models import Job, JobEvent
from jobs.services import job_cancel
from leases.choices import LeaseState
from leases.models import Lease, LeaseEvent
from leases.services.reserve import lease_reserve
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
    assert found["double"] == [101]
    assert from_history["containers_started"] < 4  # what a query after a long run sees
    assert from_watch == found
    assert watched.error is None  # closed by stop(): no broken watch


def engine_event(action: str, container: str, at: float, job: int, attempt: int, node: int):
    """A container event as the engine streams it (docker's decoded events)."""
    attributes = {
        "computepool.job": str(job),
        "computepool.attempt": str(attempt),
        "computepool.lease": str(1000 + attempt),
        "computepool.node_id": str(node),
    }
    return {
        "status": action,
        "id": container,
        "timeNano": int(at * 1e9),
        "Actor": {"ID": container, "Attributes": attributes},
    }


def test_a_job_two_of_whose_containers_ran_at_once_is_a_double_run_whatever_the_attempt():
    """The double run that matters: an old attempt still running on a cut-off node while the
    next attempt of the same job runs elsewhere; and two containers of one job on one node.
    One attempt after the other, on any nodes, is no double run."""
    events = sorted(
        [
            # job 7: attempt 1 on node 1 runs on while attempt 2 starts on node 2
            engine_event("start", "a1", 10, job=7, attempt=1, node=1),
            engine_event("start", "a2", 20, job=7, attempt=2, node=2),
            engine_event("die", "a2", 25, job=7, attempt=2, node=2),
            engine_event("die", "a1", 30, job=7, attempt=1, node=1),
            # job 8: two containers of one attempt on one node at once
            engine_event("start", "b1", 11, job=8, attempt=1, node=3),
            engine_event("start", "b2", 12, job=8, attempt=1, node=3),
            engine_event("die", "b1", 13, job=8, attempt=1, node=3),
            # job 9: attempt 1 ended before attempt 2 began, on another node: a retry
            engine_event("start", "c1", 10, job=9, attempt=1, node=1),
            engine_event("die", "c1", 14, job=9, attempt=1, node=1),
            engine_event("start", "c2", 15, job=9, attempt=2, node=2),
            engine_event("die", "c2", 16, job=9, attempt=2, node=2),
            # job 10: an old attempt never seen to die (still running) beside the next one
            engine_event("start", "d1", 10, job=10, attempt=1, node=1),
            engine_event("start", "d2", 40, job=10, attempt=2, node=1),
        ],
        key=lambda e: e["timeNano"],
    )
    found = engine_double_runs(NO_CONTAINERS, 0, events=events)
    assert found["containers_started"] == 8
    assert found["double"] == [7, 8, 10]
    (overlap, *_) = found["overlaps"]
    assert overlap["job"] == 7
    assert [(r["attempt"], r["node"]) for r in overlap["runs"]] == [(1, "1"), (2, "2")]


class _FakeDocker:
    def __init__(self, stream):
        self.stream = stream

    def events(self, **_):
        return self.stream

    def close(self):
        pass


def _broken_stream():
    yield engine_event("start", "a1", 10, job=7, attempt=1, node=1)
    raise ConnectionError("the engine's socket was reset")


def _ended_stream():
    yield engine_event("start", "a1", 10, job=7, attempt=1, node=1)


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (_broken_stream, "ConnectionError: the engine's socket was reset"),
        (_ended_stream, "the engine ended the event stream"),
    ],
)
def test_an_engine_watch_that_broke_says_so_and_cannot_report_no_double_run(
    monkeypatch, tenant, stream, error
):
    monkeypatch.setattr(docker, "from_env", lambda: _FakeDocker(stream()))
    watched = EngineEvents(NO_CONTAINERS)
    watched.thread.join(timeout=5)
    events = watched.stop()
    assert len(events) == 1 and watched.error == error
    result = audit(
        _test_database_url(),
        control_plane_labels=NO_CONTAINERS,
        since=time.time() - 60,
        followers_seen={},
        engine_events=events,
        engine_error=watched.error,
    )
    assert result["double_runs"] is None  # never 0 from a watch that broke
    assert result["details"]["double_runs_engine"]["watch_error"] == error


def test_jobs_that_ran_without_a_container_the_engine_saw_are_counted(pool, tenant):
    """A label that matched nothing (another control plane's id, a renamed label) would show
    no container, and with it no double run: a job that ran must have been seen."""
    node = build_node(pool, "n1")
    job = submit_job(pool, tenant, "ran", cpu=500)
    assert job.pk in scheduling_pass(pool_id=pool.pk).placed
    lease = job.leases.get(state=LeaseState.RESERVED)
    for step in ("starting", "running", "succeeded"):
        job_report(
            job=job,
            node=node,
            fencing_token=lease.fencing_token,
            step=step,
            actor=Actor.for_node(node),
        )
    seen = [
        engine_event("start", "a1", time.time() - 5, job=job.pk, attempt=1, node=node.pk),
        engine_event("die", "a1", time.time() - 4, job=job.pk, attempt=1, node=node.pk),
    ]

    def audited_with(events):
        return audit(
            _test_database_url(),
            control_plane_labels=NO_CONTAINERS,
            since=time.time() - 60,
            followers_seen={},
            engine_events=events,
        )

    unseen = audited_with([])
    assert unseen["runs_unseen_by_engine"] == 1 and unseen["double_runs"] == 0
    assert unseen["details"]["double_runs_engine"]["unseen"] == [job.pk]
    assert audited_with(seen)["runs_unseen_by_engine"] == 0


# --- backfills in the capacity history ---------------------------------------------------------
def lease_row(pool, tenant, node, cpu: int, **fields) -> Lease:
    """A lease row as the product writes it (the history below is its events)."""
    return Lease.objects.create(
        pool=pool,
        tenant=tenant,
        node=node,
        cpu_millicores=cpu,
        memory_mib=64,
        expires_at=timezone.now() + timedelta(hours=1),
        **fields,
    )


def lease_event(lease, from_state: str, to_state: str, reason: str, at):
    LeaseEvent.record(
        lease, actor=SYSTEM, from_state=from_state, to_state=to_state, reason=reason, at=at
    )


@pytest.fixture
def reservation(pool, tenant):
    """A node: a reservation of half its CPU (window an hour ahead), another lease of the
    other half beside it (the node full), both reserved."""
    node = build_node(pool, "n1", cpu=4000)
    half = node.cpu_millicores_allocatable // 2
    start = timezone.now() + timedelta(hours=1)
    parent = lease_row(
        pool, tenant, node, half, window_start=start, window_end=start + timedelta(hours=1)
    )
    other = lease_row(pool, tenant, node, node.cpu_millicores_allocatable - half)
    now = timezone.now()
    lease_event(parent, "", "reserved", Reason.RESERVED, now)
    lease_event(other, "", "reserved", Reason.RESERVED, now)
    return SimpleNamespace(node=node, parent=parent, other=other, now=now, half=half)


def test_a_backfill_inside_its_reservation_is_no_overcommit(reservation, pool, tenant):
    """The backfill runs on what the reservation holds (the ledger counts it once); claimed,
    the reservation's backfills are expired in the same transaction (the same `at`)."""
    r = reservation
    child = lease_row(pool, tenant, r.node, r.half, backfill_of=r.parent)
    lease_event(child, "", "reserved", Reason.RESERVED, r.now)
    claimed = r.now + timedelta(seconds=5)
    lease_event(r.parent, "reserved", "committed", Reason.COMMITTED, claimed)
    lease_event(child, "reserved", "expired", Reason.BACKFILL_WINDOW_CLOSED, claimed)
    assert audited(tenant, seen=[])["overcommitted_nodes"] == 0


def test_a_backfill_holding_past_its_reservation_claim_is_an_overcommit(reservation, pool, tenant):
    """The reservation's job starts on its capacity (claimed) while the backfill still holds:
    the node holds one and a half times its CPU."""
    r = reservation
    child = lease_row(pool, tenant, r.node, r.half, backfill_of=r.parent)
    lease_event(child, "", "reserved", Reason.RESERVED, r.now)
    lease_event(child, "reserved", "committed", Reason.COMMITTED, r.now)
    lease_event(r.parent, "reserved", "committed", Reason.COMMITTED, r.now + timedelta(seconds=5))
    later = r.now + timedelta(seconds=9)
    lease_event(child, "committed", "expired", Reason.BACKFILL_WINDOW_CLOSED, later)
    result = audited(tenant, seen=[])
    assert result["overcommitted_nodes"] == 1
    assert result["details"]["overcommitted"] == [r.node.pk]


def test_a_backfill_its_reservation_left_running_holds_its_own_part_from_then(
    reservation, pool, tenant
):
    """The reservation ends before its window (its owner released it): the backfill inside it
    holds its own part from then (`backfill_adopted`, its `backfill_of` cleared): counted once
    before and once after, never beside the reservation — no overcommit; and a lease placed
    onto the returned capacity beside it is one."""
    r = reservation
    child = lease_row(pool, tenant, r.node, r.half)  # backfill_of cleared by the adoption
    lease_event(child, "", "reserved", Reason.RESERVED, r.now)
    lease_event(child, "reserved", "committed", Reason.COMMITTED, r.now)
    ended = r.now + timedelta(seconds=5)
    lease_event(r.parent, "reserved", "released", Reason.RELEASED_BY_CLIENT, ended)
    LeaseEvent.record(
        child,
        actor=SYSTEM,
        from_state="committed",
        to_state="committed",
        reason=Reason.BACKFILL_ADOPTED,
        at=ended,
        data={"backfill_of": r.parent.pk},
    )
    assert audited(tenant, seen=[])["overcommitted_nodes"] == 0
    beside = lease_row(pool, tenant, r.node, r.half)
    lease_event(beside, "", "reserved", Reason.RESERVED, ended + timedelta(seconds=1))
    assert audited(tenant, seen=[])["overcommitted_nodes"] == 1


def test_backfills_lent_beyond_their_reservation_are_an_overcommit(reservation, pool, tenant):
    r = reservation
    for _ in range(2):  # 2 × 3/4 of the reservation inside it
        child = lease_row(pool, tenant, r.node, r.half * 3 // 4, backfill_of=r.parent)
        lease_event(child, "", "reserved", Reason.RESERVED, r.now)
    assert audited(tenant, seen=[])["overcommitted_nodes"] == 1


def test_a_backfill_container_running_beside_its_reservation_job_is_an_overcommit(
    reservation, pool, tenant
):
    """The leases' history may be clean (the backfill's lease expired at the claim) while its
    container still ran when the reservation's job's container started: the engine says so."""
    r = reservation
    child = lease_row(pool, tenant, r.node, r.half, backfill_of=r.parent)
    lease_event(child, "", "reserved", Reason.RESERVED, r.now)
    claimed = r.now + timedelta(seconds=5)
    lease_event(r.parent, "reserved", "committed", Reason.COMMITTED, claimed)
    lease_event(child, "reserved", "expired", Reason.BACKFILL_WINDOW_CLOSED, claimed)

    def container(action, name, at, job, lease):
        event = engine_event(action, name, at, job=job, attempt=1, node=r.node.pk)
        event["Actor"]["Attributes"]["computepool.lease"] = str(lease.pk)
        return event

    t = time.time() - 30
    apart = [
        container("start", "bf", t, 501, child),
        container("die", "bf", t + 1, 501, child),
        container("start", "rs", t + 2, 502, r.parent),
    ]
    beside = [
        container("start", "bf", t, 501, child),
        container("start", "rs", t + 2, 502, r.parent),
        container("die", "bf", t + 3, 501, child),
    ]

    def audited_with(events):
        return audit(
            _test_database_url(),
            control_plane_labels=NO_CONTAINERS,
            since=t - 1,
            followers_seen={},
            engine_events=events,
        )

    assert audited_with(apart)["overcommitted_nodes"] == 0
    result = audited_with(beside)
    assert result["overcommitted_nodes"] == 1
    assert result["details"]["backfills_beside_their_reservation"] == [
        {"backfill": child.pk, "reservation": r.parent.pk, "node": r.node.pk}
    ]


def test_recovery_is_measured_from_each_fault_end_to_the_next_job_a_pass_placed(pool, tenant):
    """A lease reserved through the lease API right after the fault is no placement: the next
    job a scheduling pass placed is."""
    build_node(pool, "n1")
    job = submit_job(pool, tenant, "after", cpu=500)
    end = time.time()
    lease_reserve(
        pool=pool,
        tenant=tenant,
        request=cpu_request(cpu=500, memory=256),
        actor=SYSTEM,
        duration=60,
    )
    time.sleep(1.0)
    assert job.pk in scheduling_pass(pool_id=pool.pk).placed
    load = SimpleNamespace(samples=lambda: [(end + 0.1 * i, 0.01, "2xx") for i in range(20)])
    fault = {"name": "beat_kill", "started_at": end - 1, "ended_at": end}
    (figures,) = recovery([fault], _test_database_url(), load)
    assert figures["name"] == "beat_kill"
    assert 0.9 <= figures["to_next_placement_s"] <= 3.0


def test_recovery_to_p99_is_against_the_p99_before_the_first_fault():
    """Before the first fault the API answers in 10 ms; for 5 s after the fault's end in
    500 ms (a sixth of the run: the run's own p99), then in 10 ms again: back 5 s after."""
    start = time.time() - 100
    end = start + 20
    before = [(start + 0.1 * i, 0.01, "2xx") for i in range(190)]
    after = [(end + 0.1 * i, 0.5 if i < 50 else 0.01, "2xx") for i in range(100)]
    load = SimpleNamespace(samples=lambda: before + after)
    faults = [{"name": "web_kill", "started_at": end - 1, "ended_at": end}]
    (figures,) = recovery(faults, _test_database_url(), load)
    assert figures["to_p99_s"] == pytest.approx(5.0, abs=0.01)
    # with nothing before the first fault there is no baseline to be back within
    load = SimpleNamespace(samples=lambda: after)
    (figures,) = recovery(faults, _test_database_url(), load)
    assert figures["to_p99_s"] is None
