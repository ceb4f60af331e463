"""Issue 20, assignments pushed to agents (docs/data-plane.md "Assignments"): every change of
what a node runs nudges that node once committed (nodes/push.py), and the agent's long poll,
`GET /api/v1/agent/assignments/wait`, served by the real web server process (hypercorn on the
ASGI app, as `make run` starts it) over the real Redis channel layer, wakes on its own node's
nudge only. The nudge carries nothing: the assignments are read from the normal endpoint."""

import threading
import time

import pytest
import redis
import requests
from django.conf import settings

from config.builders import SYSTEM, submit_job
from jobs.choices import JobState
from jobs.lifecycle import job_request_checkpoint
from jobs.services import job_cancel
from leases.choices import LeaseState
from nodes import push
from nodes import services as node_services
from pools.actors import Actor
from pools.reasons import Reason
from scheduling.passes import scheduling_pass
from tests.clients import bearer_client, client_for, node_key
from tests.live_events import own_channel_layer
from tests.web_server import web_server
from worker_agent.identity import SignedBy

WAIT = "/api/v1/agent/assignments/wait"


@pytest.fixture
def nudged(monkeypatch):
    """The node ids each commit queued for a push, in order."""
    sent = []
    monkeypatch.setattr(push._sender, "put", lambda ids: sent.append(set(ids)))
    return sent


def report(node_api, job, lease, step, **body):
    body = {"fencing_token": str(lease.fencing_token), "step": step, **body}
    response = node_api.post(f"/api/v1/agent/jobs/{job.pk}/report", body, format="json")
    assert response.status_code == 200, response.json()


def test_each_change_of_a_nodes_work_nudges_it_once_committed(
    agent, tenant, nudged, django_capture_on_commit_callbacks
):
    node = agent.node
    job = submit_job(node.pool, tenant, "pushed", checkpointable=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert scheduling_pass(pool_id=node.pool_id).placed == [job.pk]
    assert nudged == [{node.pk}]  # the batch pass: one nudge per node per commit

    # the node's own reports change nothing it does not know: not pushed back to it
    lease = job.leases.get()
    node_api = bearer_client(agent.secret)
    with django_capture_on_commit_callbacks(execute=True):
        for step in ("pulling", "starting", "running"):
            report(node_api, job, lease, step)
    assert nudged == [{node.pk}]

    with django_capture_on_commit_callbacks(execute=True):  # a drain's or a preemption's ask
        job_request_checkpoint(job=job, actor=SYSTEM, reason=Reason.PREEMPTED, message="make room")
    assert nudged[1:] == [{node.pk}]

    other = submit_job(node.pool, tenant, "cancelled")
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_pass(pool_id=node.pool_id)
        job_cancel(job=other, actor=SYSTEM)  # reserved: the lease is released at once
    assert nudged[2:] == [{node.pk}, {node.pk}]
    assert other.leases.get().state == LeaseState.RELEASED


def test_a_failing_push_never_fails_or_undoes_the_change(
    agent, tenant, monkeypatch, django_capture_on_commit_callbacks
):
    def broken(ids):
        raise RuntimeError("no thread can start")

    monkeypatch.setattr(push._sender, "put", broken)
    job = submit_job(agent.node.pool, tenant, "placed anyway")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert scheduling_pass(pool_id=agent.node.pool_id).placed == [job.pk]
    assert callbacks  # they ran, and raised nothing
    job.refresh_from_db()
    assert job.state == JobState.LEASED


@pytest.mark.django_db(transaction=True)
def test_a_broken_channel_layer_never_undoes_a_committed_placement(agent, tenant):
    job = submit_job(agent.node.pool, tenant, "placed anyway")
    with own_channel_layer(hosts=[{"address": "redis://127.0.0.1:9", "socket_timeout": 1}]):
        assert scheduling_pass(pool_id=agent.node.pool_id).placed == [job.pk]
        assert push.flush(10)  # sent, or failed and logged
    job.refresh_from_db()
    assert job.state == JobState.LEASED


# --- the long poll, over the real web server ----------------------------------------------


def _subscribed(node_id: int, timeout: float = 10) -> None:
    """Until the node's group on Redis has a member (the wait subscribed)."""
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{config['prefix']}:group:{push.node_group(node_id)}"
    deadline = time.monotonic() + timeout
    while not client.zcard(key):
        assert time.monotonic() < deadline, "the wait never subscribed"
        time.sleep(0.02)


class Waiter(threading.Thread):
    """One long poll in the background: its answer and when it came."""

    def __init__(self, url: str, secret: str, timeout: float):
        super().__init__(daemon=True)
        self.url, self.secret, self.timeout = url, secret, timeout
        self.key = node_key(secret)  # signed as the node's agent signs
        self.answer = self.at = self.started = None

    def run(self):
        self.started = time.monotonic()
        self.answer = requests.get(
            f"{self.url}{WAIT}",
            params={"timeout": self.timeout},
            headers={"Authorization": f"Bearer {self.secret}"},
            auth=SignedBy(self.key),
            timeout=self.timeout + 15,
        )
        self.at = time.monotonic()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_placement_wakes_its_nodes_wait_and_no_other(enroll, private_pool, tenant):
    target, other = (enroll(private_pool, name=name) for name in ("push-a", "push-b"))
    # only the target is ready (its first heartbeat): the job can go nowhere else
    node_services.node_heartbeat(node=target.node, actor=Actor.for_node(target.node))
    with own_channel_layer():
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        # the slow-client deadlines (2 s here) cut slow requests, never a long poll's wait
        deadlines = {"HTTP_HEADER_TIMEOUT_S": "2", "HTTP_BODY_TIMEOUT_S": "2"}
        with web_server(CHANNEL_LAYER_PREFIX=prefix, **deadlines) as url:
            woken = Waiter(url, target.secret, 20)
            idle = Waiter(url, other.secret, 6)
            woken.start()
            idle.start()
            _subscribed(target.node.pk)
            _subscribed(other.node.pk)
            job = submit_job(private_pool, tenant, "pushed")
            placed_at = time.monotonic()
            assert scheduling_pass(pool_id=private_pool.pk).placed == [job.pk]
            woken.join(20)
            idle.join(20)
    assert job.leases.get().node_id == target.node.pk
    assert woken.answer.status_code == 200 and woken.answer.json() == {"changed": True}
    assert woken.at - placed_at < 3  # at once, not at its 20 s timeout
    assert idle.answer.status_code == 200 and idle.answer.json() == {"changed": False}
    assert idle.at - idle.started >= 6  # its own timeout, past the slow-client deadlines
    assert idle.at > placed_at + 1  # it was waiting when the other node's nudge went


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_wait_refuses_what_the_other_agent_endpoints_refuse(agent, member):
    with own_channel_layer():
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        with web_server(CHANNEL_LAYER_PREFIX=prefix) as url:

            def get(secret=None, **params):
                headers = {"Authorization": f"Bearer {secret}"} if secret else {}
                key = node_key(secret) if secret else None
                signed = SignedBy(key) if key is not None else None
                return requests.get(
                    f"{url}{WAIT}", params=params, headers=headers, auth=signed, timeout=20
                )

            nobody = get()
            forged = get("cpn_not-a-credential")
            person = client_for(member)  # a person's token: authenticated, not a node
            token = person._credentials["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
            as_person = get(token)
            too_long, too_short, word = (
                get(agent.secret, timeout=t) for t in ("31", "0.5", "soon")
            )
            started = time.monotonic()
            timed_out = get(agent.secret, timeout="1")
            elapsed = time.monotonic() - started
    assert (nobody.status_code, forged.status_code, as_person.status_code) == (401, 401, 403)
    assert nobody.headers["WWW-Authenticate"] == "Bearer"
    assert forged.json()["code"] == "authentication_failed"
    assert as_person.json()["code"] == "permission_denied"
    for answer in (too_long, too_short, word):
        assert answer.status_code == 400 and "timeout" in answer.json()["errors"]
    assert timed_out.status_code == 200 and timed_out.json() == {"changed": False}
    assert 1 <= elapsed < 5
