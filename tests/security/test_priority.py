"""Issue 9, medium: priority classes are restricted per tenant and per tenant role."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from config.builders import SYSTEM, build_person
from jobs.models import Job
from pools.choices import TenantRole
from pools.models import PriorityClass, Tenant
from pools.services import membership_set
from tests.jobs.test_api import submit

NOT_OPEN = "No priority class of this name is open to you in this tenant."


@pytest.fixture
def priorities(tenant, other_tenant):
    production = PriorityClass.objects.create(
        name="production", value=1000, minimum_role=TenantRole.ADMIN
    )
    nlp_only = PriorityClass.objects.create(name="nlp-rush", value=500)
    nlp_only.allowed_tenants.set([other_tenant])
    batch = PriorityClass.objects.create(name="batch", value=100)
    return production, nlp_only, batch


def test_members_cannot_submit_at_an_admin_only_class(
    api, member, tenant_admin, cpu_shape, ready_node, priorities
):
    refused = submit(api(member), priority_class="production")
    assert refused.status_code == 400
    # The same answer as for a class that does not exist: restricted classes stay unnamed.
    assert refused.json()["priority_class"] == [NOT_OPEN]
    assert submit(api(member), priority_class="nope").json()["priority_class"] == [NOT_OPEN]
    assert not Job.objects.exists()
    allowed = submit(api(tenant_admin), priority_class="production")
    assert allowed.status_code == 201 and allowed.json()["priority_class"] == "production"
    assert submit(api(member), priority_class="batch").status_code == 201


def test_tenant_restricted_class_only_for_its_tenants(
    api, member, outsider, cpu_shape, ready_node, priorities
):
    refused = submit(api(member), priority_class="nlp-rush")
    assert refused.status_code == 400 and refused.json()["priority_class"] == [NOT_OPEN]
    outsider_job = submit(api(outsider), tenant="nlp", priority_class="nlp-rush")
    assert outsider_job.status_code == 201


def test_one_selector_decides(member, tenant_admin, outsider, tenant, other_tenant, priorities):
    def names(user, t):
        return sorted(PriorityClass.objects.allowed_to(user, t).values_list("name", flat=True))

    assert names(member, tenant) == ["batch"]
    assert names(tenant_admin, tenant) == ["batch", "production"]
    assert names(outsider, other_tenant) == ["batch", "nlp-rush"]
    assert names(outsider, tenant) == []  # not a member of that tenant


def test_demo_production_is_for_tenant_admins_only(db):
    call_command("load_demo")
    people = {u.username: u for u in get_user_model().objects.filter(username__in=["alice", "bob"])}
    vision, nlp = Tenant.objects.get(slug="vision"), Tenant.objects.get(slug="nlp")
    alice_classes = PriorityClass.objects.allowed_to(people["alice"], vision)
    bob_classes = PriorityClass.objects.allowed_to(people["bob"], nlp)
    assert "production" not in alice_classes.values_list("name", flat=True)
    assert "production" in bob_classes.values_list("name", flat=True)


def test_policy_admins_restrict_a_class_in_the_django_admin(policy_admin, tenant, other_tenant):
    client = Client()
    client.force_login(policy_admin)
    response = client.post(
        "/admin/pools/priorityclass/add/",
        {
            "name": "vision-urgent",
            "value": 800,
            "preemptible": "on",
            "description": "",
            "allowed_tenants": [tenant.pk],
            "minimum_role": TenantRole.ADMIN,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    created = PriorityClass.objects.get(name="vision-urgent")
    assert list(created.allowed_tenants.all()) == [tenant]
    assert created.minimum_role == TenantRole.ADMIN
    admin = build_person("vadmin")
    membership_set(user=admin, tenant=tenant, role=TenantRole.ADMIN, actor=SYSTEM)
    assert PriorityClass.objects.allowed_to(admin, tenant).filter(pk=created.pk).exists()
    assert not PriorityClass.objects.allowed_to(admin, other_tenant).exists()
