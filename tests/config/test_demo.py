from django.contrib.auth import get_user_model
from django.core.management import call_command

from config.demo import agent_enrollment_token
from nodes import services as node_services
from nodes.models import Node, NodeEvent
from pools.actors import Actor
from pools.knobs import knobs_for
from pools.models import ComputePool, PriorityClass, ResourceShape, SchedulingPolicyVersion, Tenant
from worker_agent.identity import NodeKey


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
    assert first["ComputePool"] == 2 and first["Tenant"] == 2 and first["Node"] >= 4
    # Example nodes have no agent: registered, never schedulable.
    assert not Node.objects.filter(state="ready").exists()
    printed = capsys.readouterr().out
    assert "alice" in printed and "olga" in printed  # credentials are printed
    call_command("load_demo")
    assert _counts() == first
    assert get_user_model().objects.get(username="alice").check_password("alice-demo-pass")


def test_only_the_dev_pool_allows_the_process_runtime(db):
    call_command("load_demo")
    lab, dev = ComputePool.objects.get(slug="lab"), ComputePool.objects.get(slug="dev")
    assert knobs_for(lab).allow_process_runtime is False
    assert knobs_for(dev).allow_process_runtime is True
    assert lab.shapes.get(name="cpu-small").container_runtime == "docker"
    assert lab.shapes.get(name="cpu-small-gvisor").container_runtime == "gvisor"
    assert knobs_for(lab).required_runtime == ""  # cpu-small stays runnable
    assert dev.shapes.get(name="cpu-small").container_runtime == "process"
    for pool in (lab, dev):
        assert list(pool.registries.values_list("prefix", flat=True)) == ["127.0.0.1:5000/"]


def test_phantom_ready_nodes_of_an_old_demo_are_retired(db):
    call_command("load_demo")
    # What an earlier demo left: an example node made ready without any agent.
    actor = Actor.system("old-demo")
    node = node_services.node_verify(node=Node.objects.get(name="cpu-01"), actor=actor)
    node = node_services.node_mark_ready(node=node, actor=actor)
    call_command("load_demo")
    assert Node.objects.get(pk=node.pk).state == "retired"


def test_the_enrollment_token_enrolls_a_node_into_its_pool(db):
    call_command("load_demo")
    node, _, _ = node_services.node_enroll(
        secret=agent_enrollment_token("dev"),
        name="local-agent",
        inventory={"cpu_millicores": 2000, "memory_mib": 4096, "scratch_mib": 0, "gpus": []},
        public_key=NodeKey.generate().public_key,
    )
    assert node.pool.slug == "dev"
