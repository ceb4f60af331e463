"""Issue #17: defining shapes and changing scheduling policy are separate roles. A shape admin
edits shapes and nothing of policy; a policy admin (the demo's paula) keeps quotas, priority
classes, registries and policy versions, and no longer edits shapes: in the Django admin and
the API alike."""

import importlib

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission

from config.builders import build_person
from pools.models import ResourceShape

split = importlib.import_module("pools.migrations.0011_split_read_scope_shape_admin")

SHAPE = {
    "name": "cpu-huge",
    "cpu_millicores_min": 64000,
    "memory_mib_min": 1024,
    "gpu_count": 0,
    "gpu_models": "[]",
    "gpu_memory_mib_min": 0,
    "gpu_sharing_class": "none",
    "gpu_milli": 0,
    "scratch_mib": 0,
    "architecture": "amd64",
    "os": "linux",
    "container_runtime": "docker",
    "regions": "[]",
    "zones": "[]",
    "regions_preferred": "[]",
    "zones_preferred": "[]",
    "trust_level_min": 0,
}
POLICY_PAGES = [
    "/admin/pools/quota/",
    "/admin/pools/quota/add/",
    "/admin/pools/priorityclass/add/",
    "/admin/pools/allowedregistry/add/",
    "/admin/pools/schedulingpolicyversion/add/",
    "/admin/pools/creditaccount/",
]


def add_shape(client, pool):
    return client.post("/admin/pools/resourceshape/add/", SHAPE | {"pool": pool.pk})


def test_a_shape_admin_defines_shapes(client, shape_admin, pool):
    client.force_login(shape_admin)
    assert add_shape(client, pool).status_code == 302
    shape = ResourceShape.objects.get(name="cpu-huge")
    change = f"/admin/pools/resourceshape/{shape.pk}/change/"
    assert client.get(change).status_code == 200


@pytest.mark.parametrize("url", POLICY_PAGES)
def test_a_shape_admin_changes_no_policy_in_the_admin(client, shape_admin, url):
    client.force_login(shape_admin)
    assert client.get(url).status_code == 403


def test_a_shape_admin_publishes_no_policy_version_and_sees_no_tenant(api, shape_admin, pool):
    url = f"/api/v1/pools/{pool.slug}/policy-versions"
    client = api(shape_admin)
    assert client.post(url, {"weights": {"bin_pack": 1}}, format="json").status_code == 403
    assert pool.scheduling_policy.versions.count() == 1
    assert client.get("/api/v1/tenants").json()["results"] == []


def test_a_policy_admin_no_longer_edits_shapes(client, policy_admin, pool, api):
    client.force_login(policy_admin)
    assert add_shape(client, pool).status_code == 403
    assert not ResourceShape.objects.filter(name="cpu-huge").exists()
    assert client.get("/admin/pools/resourceshape/").status_code == 403
    for url in POLICY_PAGES:  # and keeps the policy
        assert client.get(url).status_code == 200, url
    versions = f"/api/v1/pools/{pool.slug}/policy-versions"
    assert (
        api(policy_admin).post(versions, {"weights": {"bin_pack": 1}}, format="json").status_code
        == 201
    )


def test_the_migration_takes_shapes_from_an_existing_policy_admin_group(client, pool):
    """A database from before the split: the policy admins' group held the shape permissions."""
    paula = build_person("paula")
    group, _ = Group.objects.get_or_create(name="policy_admin")
    group.permissions.set(Permission.objects.filter(content_type__app_label="pools"))
    paula.groups.add(group)
    paula.is_staff = True
    paula.save(update_fields=["is_staff"])
    client.force_login(paula)
    assert client.get("/admin/pools/resourceshape/add/").status_code == 200  # before

    split.shapes_leave_policy_admins(apps, None)

    assert client.get("/admin/pools/resourceshape/add/").status_code == 403
    assert add_shape(client, pool).status_code == 403
    assert client.get("/admin/pools/quota/").status_code == 200
