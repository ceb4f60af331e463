"""The one permission point: `Model.objects.visible_to(actor)` for every model that uses it.

One small world is built through the services: tenants A and B with a person each, an
operator, two nodes, and on each node a job of one tenant with its leases. Each row is named
after what it belongs to, so the tables below read as "who sees whose rows".
"""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from jobs.models import Job, JobEvent
from jobs.services import job_submit
from leases.models import Lease, LeaseEvent
from leases.services import lease_release, lease_reserve
from nodes.choices import ProbeKind
from nodes.models import EnrollmentToken, GpuDevice, Node, NodeCredential, NodeEvent, NodeProbe
from nodes.services import (
    enrollment_token_issue,
    node_credential_reissue,
    node_mark_ready,
    node_register,
    node_verify,
    probe_request,
)
from pools.actors import Actor
from pools.models import (
    ApiToken,
    ComputePool,
    Membership,
    PriorityClass,
    Quota,
    ResourceShape,
    Tenant,
)
from pools.reasons import Reason
from pools.services import api_token_issue, pool_create

pytestmark = pytest.mark.django_db

SYSTEM = Actor.system("tests")
ACTORS = ("person_a", "person_b", "operator", "node_1", "anonymous", "system")
ALL = "every row"

# For each model: how a row is named, and what each actor sees ({} = nothing).
TENANT_OWNED = {"person_a": {"a"}, "person_b": {"b"}, "operator": ALL, "node_1": set()}
NODE_OWNED = {"person_a": set(), "person_b": set(), "operator": ALL, "node_1": {"node-1"}}
PUBLIC = {"person_a": ALL, "person_b": ALL, "operator": ALL, "node_1": set()}
OPERATORS_ONLY = {"person_a": set(), "person_b": set(), "operator": ALL, "node_1": set()}
CASES = {
    Tenant: (lambda t: t.slug, TENANT_OWNED),
    Membership: (lambda m: m.tenant.slug, TENANT_OWNED),
    Quota: (lambda q: q.tenant.slug, TENANT_OWNED),
    ComputePool: (lambda p: p.slug, PUBLIC),
    ResourceShape: (lambda s: f"{s.pool.slug}/{s.name}", PUBLIC),
    PriorityClass: (lambda c: c.name, PUBLIC),
    ApiToken: (
        lambda t: t.user.username,
        {"person_a": {"person-a"}, "person_b": {"person-b"}, "operator": {"operator"}},
    ),
    Node: (lambda n: n.name, NODE_OWNED),
    GpuDevice: (lambda g: g.node.name, NODE_OWNED),
    NodeEvent: (lambda e: e.node.name, NODE_OWNED),
    NodeProbe: (lambda p: p.node.name, NODE_OWNED),
    NodeCredential: (lambda c: c.node.name, OPERATORS_ONLY),
    EnrollmentToken: (lambda t: t.name, OPERATORS_ONLY),
    # tenant A's job runs on node-1, tenant B's on node-2
    Job: (lambda j: j.tenant.slug, TENANT_OWNED | {"node_1": {"a"}}),
    JobEvent: (lambda e: e.job.tenant.slug, TENANT_OWNED | {"node_1": {"a"}}),
    Lease: (lambda lease: lease.tenant.slug, TENANT_OWNED | {"node_1": {"a"}}),
    LeaseEvent: (lambda e: e.lease.tenant.slug, TENANT_OWNED | {"node_1": {"a"}}),
}


def ready_node(pool, name):
    node = node_register(
        pool=pool,
        name=name,
        actor=SYSTEM,
        cpu_millicores=16000,
        memory_mib=65536,
        scratch_mib=100_000,  # disk for the jobs' /outputs
        gpus=[{"index": 0, "uuid": f"GPU-{name}", "model": "A100-80GB", "memory_mib": 81920}],
    )
    return node_mark_ready(node=node_verify(node=node, actor=SYSTEM), actor=SYSTEM)


def run_job(pool, tenant, node, person):
    """A job of `tenant` with two leases on `node` (one released, one held)."""
    actor = Actor.for_user(person)
    request = {"cpu_millicores_min": 1000, "memory_mib_min": 1024, "node_pin": node.name}
    job = job_submit(
        tenant=tenant, pool=pool, name="train", image="img", resources=request, actor=actor
    )
    for _ in range(2):
        lease = lease_reserve(
            pool=pool,
            tenant=tenant,
            request=request,
            actor=actor,
            duration=timedelta(minutes=5),
            job=job,
        )
        assert lease.node == node
    # a live job's lease: only the system ends it so (a person cancels the job)
    lease_release(lease=lease, actor=Actor.system("world"), reason=Reason.RELEASED_BY_CLIENT)


@pytest.fixture
def actors(pool, tenant, other_tenant, member, outsider, operator):
    """Tenant A is `tenant` (slug "vision"), tenant B `other_tenant` ("nlp"), renamed a and b."""
    Tenant.objects.filter(pk=tenant.pk).update(slug="a")
    Tenant.objects.filter(pk=other_tenant.pk).update(slug="b")
    tenant.refresh_from_db()
    other_tenant.refresh_from_db()
    member.username, outsider.username = "person-a", "person-b"
    member.save()
    outsider.save()
    for p in (pool, pool_create(name="Other pool", slug="other")):
        ResourceShape.objects.create(pool=p, name="small", cpu_millicores_min=1, memory_mib_min=1)
    PriorityClass.objects.create(name="batch", value=10)
    PriorityClass.objects.create(name="urgent", value=100)
    for t in (tenant, other_tenant):
        Quota.objects.create(tenant=t, pool=pool, cpu_millicores=10**6, memory_mib=10**6)
    nodes = [ready_node(pool, "node-1"), ready_node(pool, "node-2")]
    run_job(pool, tenant, nodes[0], member)
    run_job(pool, other_tenant, nodes[1], outsider)
    for node in nodes:
        probe_request(node=node, kind=ProbeKind.VALIDATION, actor=SYSTEM)
        node_credential_reissue(node=node, actor=SYSTEM)
    for name in ("join", "join-more"):
        enrollment_token_issue(pool=pool, actor=Actor.for_user(operator), name=name)
    for person in (member, outsider, operator):
        api_token_issue(user=person, name="cli")
    return {
        "person_a": Actor.for_user(member),
        "person_b": Actor.for_user(outsider),
        "operator": Actor.for_user(operator),
        "node_1": Actor.for_node(nodes[0]),
        "anonymous": Actor.from_request(None),
        "system": SYSTEM,
    }


@pytest.mark.parametrize("model", CASES, ids=lambda m: m.__name__)
def test_each_actor_sees_exactly_its_rows(actors, model):
    name, expected = CASES[model]
    every = {name(row) for row in model.objects.all()}
    assert len(every) > 1, "the world gives each model rows of more than one owner"
    for who in ACTORS:
        rows = list(model.objects.visible_to(actors[who]))
        want = expected.get(who, ALL if who == "system" else set())
        assert {name(row) for row in rows} == (every if want == ALL else want), (model, who)
        assert len(rows) == len({row.pk for row in rows}), f"{who} sees a row twice"


def test_an_unsigned_request_is_nobody_and_sees_nothing(actors):
    anonymous = actors["anonymous"]
    assert anonymous.kind == Actor.ANONYMOUS
    assert not (anonymous.is_person or anonymous.is_node or anonymous.is_system)
    assert not anonymous.is_operator and anonymous.tenant_ids == []


def test_a_node_holds_no_role_and_no_tenant(actors):
    node = actors["node_1"]
    assert not node.is_operator and not node.is_policy_admin and node.tenant_roles == {}


def test_a_policy_admin_sees_the_catalogue_tenants_and_quotas_but_no_workload(actors, policy_admin):
    # policy admins set quotas per tenant: they see every tenant, and nobody's jobs or leases
    actor = Actor.for_user(policy_admin)
    assert Tenant.objects.visible_to(actor).count() == Tenant.objects.count() == 2
    assert Lease.objects.visible_to(actor).count() == 0
    assert Job.objects.visible_to(actor).count() == 0
    assert ComputePool.objects.visible_to(actor).count() == 2


def test_a_superuser_is_an_operator(actors):
    root = get_user_model().objects.create_user(username="root", is_superuser=True)
    assert Job.objects.visible_to(Actor.for_user(root)).count() == 2
