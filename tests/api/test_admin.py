"""The ledger fields (a node's reserved capacity, a GPU's holders, a lease's capacity and
devices) are read-only in every admin: only leases.services change them, with guarded UPDATEs."""

import pytest
from django.contrib import admin
from django.test import RequestFactory

from config.builders import build_person
from pools.choices import PlatformRole


def ledger_fields(model) -> set[str]:
    """What the ledger holds on this model, by name: `*_reserved`, the GPU's MIG slots in use and
    its sharing tenant, and every column of a lease."""
    names = {field.name for field in model._meta.fields}
    if model._meta.label == "leases.Lease":
        return names
    return {n for n in names if n.endswith("_reserved")} | (
        names & {"mig_slots_used", "share_tenant", "gpu_allocations"}
    )


def every_admin(request):
    """Each registered ModelAdmin and each of its inlines, with the model it edits."""
    for model, model_admin in admin.site._registry.items():
        yield model, model_admin
        for inline in model_admin.get_inline_instances(request):
            yield inline.model, inline


@pytest.fixture
def request_of_a_policy_admin(db):
    request = RequestFactory().get("/admin/")
    request.user = build_person("padmin", platform_role=PlatformRole.POLICY_ADMIN)
    request.user.is_staff = request.user.is_superuser = True  # every permission the admin has
    return request


def test_ledger_fields_are_read_only_in_every_admin(request_of_a_policy_admin):
    request = request_of_a_policy_admin
    checked = set()
    for model, model_admin in every_admin(request):
        ledger = ledger_fields(model)
        if not ledger:
            continue
        editable = ledger - set(model_admin.get_readonly_fields(request, None))
        assert editable == set(), f"{type(model_admin).__name__} edits {sorted(editable)}"
        checked.add(model._meta.label)
    # the models that hold the ledger are all among those checked
    assert {"nodes.Node", "nodes.GpuDevice", "leases.Lease"} <= checked


def test_a_lease_cannot_be_added_in_the_admin(request_of_a_policy_admin):
    from leases.models import Lease

    assert not admin.site._registry[Lease].has_add_permission(request_of_a_policy_admin)
