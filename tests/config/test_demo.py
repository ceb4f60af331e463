from django.contrib.auth import get_user_model
from django.core.management import call_command

from nodes.models import Node, NodeEvent
from pools.models import ComputePool, PriorityClass, ResourceShape, SchedulingPolicyVersion, Tenant


def _counts():
    return {
        model.__name__: model.objects.count()
        for model in (
            ComputePool,
            Tenant,
            ResourceShape,
            PriorityClass,
            Node,
            NodeEvent,
            SchedulingPolicyVersion,
            get_user_model(),
        )
    }


def test_demo_loads_and_is_idempotent(db, capsys):
    call_command("load_demo")
    first = _counts()
    assert first["ComputePool"] == 1 and first["Tenant"] == 2 and first["Node"] >= 4
    assert Node.objects.filter(state="ready").count() == first["Node"]
    printed = capsys.readouterr().out
    assert "alice" in printed and "olga" in printed  # credentials are printed
    call_command("load_demo")
    assert _counts() == first
    assert get_user_model().objects.get(username="alice").check_password("alice-demo-pass")
