"""The publishing helper and the subscription rule shared by every stream (pools/events.py)."""

import logging

import pytest
from django.contrib.auth.models import AnonymousUser

from config.builders import SYSTEM, build_node, build_person, submit_job
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel
from nodes.models import Node
from pools.actors import Actor
from pools.choices import TenantRole
from pools.events import groups_of, subscriptions
from tests.live_events import own_channel_layer


def test_an_event_goes_to_operators_its_object_and_its_tenant(pool, tenant):
    job = submit_job(pool, tenant)
    node = build_node(pool, "n1")
    assert groups_of("jobs", job) == [
        "jobs.operators",
        f"jobs.{job.pk}",
        f"jobs.tenant-{tenant.pk}",
    ]
    assert groups_of("nodes", node) == ["nodes.operators", f"nodes.{node.pk}"]


def test_a_person_follows_what_the_api_lists_to_them(tenant, other_tenant, operator):
    both = build_person("both", tenant=tenant)
    both.memberships.create(tenant=other_tenant, role=TenantRole.MEMBER)
    both = Actor.for_user(both)
    assert sorted(subscriptions("jobs", Job, both)) == sorted(
        [f"jobs.tenant-{tenant.pk}", f"jobs.tenant-{other_tenant.pk}"]
    )
    assert subscriptions("jobs", Job, Actor.for_user(operator)) == ["jobs.operators"]
    assert subscriptions("nodes", Node, both) == []  # nodes: operators only
    assert subscriptions("nodes", Node, Actor.for_user(operator)) == ["nodes.operators"]
    assert subscriptions("jobs", Job, Actor.for_user(AnonymousUser())) == []


@pytest.mark.django_db(transaction=True)
def test_a_broken_channel_layer_never_undoes_or_fails_a_committed_transition(pool, tenant, caplog):
    with own_channel_layer(hosts=["redis://127.0.0.1:1/0"]):  # nothing listens there
        job = submit_job(pool, tenant)
        with caplog.at_level(logging.WARNING, logger="pools.events"):
            job_cancel(job=job, actor=SYSTEM)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.events.latest("id").to_state == JobState.CANCELLED
    assert "could not publish an event" in caplog.text
