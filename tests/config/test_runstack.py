"""`make run`: without Redis the embedded Redis-protocol server carries both real clients; the
local agent enrolls with a real token, or resumes with its stored credential."""

import asyncio
import shutil
import uuid

from celery import Celery
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.core.management import call_command

from config.builders import TEST_IMAGE_TAG
from config.management.commands.runstack import (
    _redis_answers,
    agent_command,
    agent_environment,
    agent_node_status,
    agent_root,
    stack_environment,
    start_embedded_redis,
)
from nodes import services as node_services
from nodes.models import ControlPlane, Node
from pools.actors import Actor
from worker_agent.identity import NodeKey
from worker_agent.state import AgentState

INVENTORY = {"cpu_millicores": 2000, "memory_mib": 4096, "scratch_mib": 0, "gpus": []}


def test_embedded_redis_serves_the_channel_layer_and_the_celery_broker():
    url = start_embedded_redis()
    assert _redis_answers(url)

    async def live_event_round_trip():
        # the project's layer settings, on the embedded server: a receive that waits past one
        # blocking pop (BZPOPMIN answers nil after brpop_timeout) still gets the event
        (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
        layer = RedisChannelLayer(hosts=[host | {"address": url}])
        channel = await layer.new_channel()
        await layer.group_add("tenant-1", channel)
        receive = asyncio.create_task(layer.receive(channel))
        await asyncio.sleep(layer.brpop_timeout + 1)
        assert not receive.done()  # still waiting, no TimeoutError
        await layer.group_send("tenant-1", {"type": "job.event", "event": {"job": 7}})
        return await asyncio.wait_for(receive, 5)

    assert asyncio.run(live_event_round_trip())["event"] == {"job": 7}
    # not set as the current app: the project's tasks must keep config.celery's (eager here)
    with Celery(broker=url, set_as_current=False).connection() as connection:
        queue = connection.SimpleQueue("computepool-test")
        queue.put({"task": "scheduling.pass"})
        assert queue.get(timeout=5).payload == {"task": "scheduling.pass"}
        queue.close()


def test_an_unreachable_redis_is_detected():
    assert not _redis_answers("redis://127.0.0.1:1/0")


# --- the local agent `make run` starts beside the server ---------------------------------


def _flag(command: list, name: str):
    return command[command.index(name) + 1] if name in command else None


def _enroll(plan, name=None):
    """What the agent does with the plan: enroll with the token of its environment, store."""
    token = plan.env["WORKER_AGENT_ENROLL_TOKEN"]
    name = name or _flag(plan.command, "--node-name")
    node, secret, _ = node_services.node_enroll(
        secret=token, name=name, inventory=INVENTORY, public_key=NodeKey.generate().public_key
    )
    AgentState(plan.state_dir).save_credential({"credential": secret})
    AgentState(plan.state_dir).save_node({"id": node.pk, "name": node.name})
    return node, secret


def test_a_fresh_agent_enrolls_into_its_pool_with_a_token_in_its_environment(db, tmp_path):
    call_command("load_demo", verbosity=0)
    plan = agent_command(api="http://x", pool="dev", runtime="process", root=tmp_path)
    assert (
        plan.command[1:3] == ["-m", "worker_agent"]
        and _flag(plan.command, "--runtime") == "process"
    )
    name = _flag(plan.command, "--node-name")
    # one state dir per node, named after it; the token is never on the command line
    assert plan.state_dir == tmp_path / name and plan.state_dir.is_dir()
    assert _flag(plan.command, "--state-dir") == str(plan.state_dir)
    assert plan.said == f"enrolls as {name}"
    assert not any(part.startswith("cpe_") for part in plan.command)
    assert "--enroll-token" not in plan.command
    node, _ = _enroll(plan)
    assert node.pool.slug == "dev"
    # That node's state dir resumes; were it lost, a new name (names are unique in a pool).
    assert agent_command(api="http://x", pool="dev", runtime="process", root=tmp_path).said == (
        "resumes its enrolled node"
    )
    shutil.rmtree(plan.state_dir)
    plan = agent_command(api="http://x", pool="dev", runtime="process", root=tmp_path)
    assert _flag(plan.command, "--node-name") == f"{name}-2"


def test_the_agent_gets_the_test_image_as_its_pause_image_unless_one_is_set(
    db, tmp_path, monkeypatch
):
    """The Docker runtime has no pause image by default: `make run` gives the test image it
    pushes to the loopback registry, or the one the environment names."""
    call_command("load_demo", verbosity=0)
    monkeypatch.delenv("WORKER_AGENT_PAUSE_IMAGE", raising=False)
    plan = agent_command(api="http://x", pool="lab", runtime="docker", root=tmp_path)
    assert _flag(plan.command, "--pause-image") == TEST_IMAGE_TAG
    monkeypatch.setenv("WORKER_AGENT_PAUSE_IMAGE", "registry.example/pause:1")
    plan = agent_command(api="http://x", pool="lab", runtime="docker", root=tmp_path)
    assert _flag(plan.command, "--pause-image") == "registry.example/pause:1"


def test_an_enrolled_agent_resumes_and_its_state_is_shown(db, tmp_path):
    call_command("load_demo", verbosity=0)
    plan = agent_command(api="http://x", pool="lab", runtime="docker", root=tmp_path)
    _enroll(plan, name="local-a")
    again = agent_command(api="http://x", pool="lab", runtime="docker", root=tmp_path)
    assert again.said == "resumes its enrolled node" and again.env == {}
    assert again.state_dir == plan.state_dir
    status = agent_node_status(plan.state_dir)
    assert status == "node local-a in pool lab: registered, reachable, no heartbeat yet"
    node = Node.objects.get(pk=AgentState(plan.state_dir).info()["node_id"])
    node_services.node_heartbeat(
        node=node, actor=Actor.for_node(node), runtime="docker", runtimes=["docker", "gvisor"]
    )
    assert agent_node_status(plan.state_dir).endswith("reachable, docker (offers docker, gvisor)")


def test_the_state_dir_is_per_control_plane_and_node(db, settings, tmp_path):
    call_command("load_demo", verbosity=0)
    settings.BASE_DIR = tmp_path
    assert agent_root() == tmp_path / "var" / "agent" / str(ControlPlane.objects.get().uuid)


def test_make_run_twice_never_touches_the_first_agents_credential(db, settings, tmp_path):
    """A second `make run` on this machine: with another database (another control-plane id)
    its agent lives under another root; with the same database while the first agent runs
    (it holds its state dir), it is another node in a dir of its own. The first credential
    stays as it was."""
    call_command("load_demo", verbosity=0)
    settings.BASE_DIR = tmp_path
    first = agent_command(api="http://x:8000", pool="lab", runtime="docker", root=agent_root())
    _, secret = _enroll(first)
    running = AgentState(first.state_dir)
    running.hold()  # the first agent runs
    beside = agent_command(api="http://x:8001", pool="lab", runtime="docker", root=agent_root())
    assert beside.said.startswith("enrolls as") and beside.state_dir != first.state_dir
    _enroll(beside)
    ControlPlane.objects.update(uuid=uuid.uuid4())  # what another database says it is
    other = agent_command(api="http://x:8002", pool="lab", runtime="docker", root=agent_root())
    assert other.state_dir.parent != first.state_dir.parent
    assert other.said.startswith("enrolls as")
    assert AgentState(first.state_dir).credential() == secret
    assert AgentState(first.state_dir).info()["node_name"] == _flag(first.command, "--node-name")


def test_a_credential_of_another_database_is_left_alone(db, tmp_path):
    call_command("load_demo", verbosity=0)
    stale = tmp_path / "gone"
    AgentState(stale).save_credential({"credential": "cpn_from_elsewhere"})
    AgentState(stale).save_node({"id": 999999, "name": "gone"})
    plan = agent_command(api="http://x", pool="lab", runtime="docker", root=tmp_path)
    assert plan.said.startswith("enrolls as") and plan.env["WORKER_AGENT_ENROLL_TOKEN"]
    assert plan.state_dir != stale
    assert AgentState(stale).credential() == "cpn_from_elsewhere"


def test_the_agent_never_inherits_the_control_planes_secrets():
    env = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
        "WORKER_AGENT_POLL_S": "1",
        "DOCKER_HOST": "unix:///var/run/docker.sock",
        "SECRET_KEY": "s",
        "DATABASE_URL": "postgres://u:p@db/cp",
        "ENCRYPTION_KEYS": "k1=abc",
        "REDIS_URL": "redis://127.0.0.1:6379/0",
    }
    assert set(agent_environment(env)) == {
        "PATH",
        "HOME",
        "LC_ALL",
        "HTTPS_PROXY",
        "WORKER_AGENT_POLL_S",
        "DOCKER_HOST",
    }


def test_make_run_reaches_the_loopback_registry_over_http_unless_told_otherwise(
    monkeypatch, tmp_path
):
    monkeypatch.delenv("REGISTRY_INSECURE_HOSTS", raising=False)
    env = stack_environment("redis://127.0.0.1:7/0", tmp_path / "metrics")
    assert env["REGISTRY_INSECURE_HOSTS"] == "127.0.0.1:5000,localhost:5000"
    assert env["REDIS_URL"] == "redis://127.0.0.1:7/0"
    monkeypatch.setenv("REGISTRY_INSECURE_HOSTS", "registry.lan:5000")
    env = stack_environment("redis://x", tmp_path / "metrics")
    assert env["REGISTRY_INSECURE_HOSTS"] == "registry.lan:5000"


def test_the_stack_s_processes_share_a_fresh_metrics_directory(tmp_path):
    left_over = tmp_path / "metrics" / "histogram_4242.db"
    left_over.parent.mkdir()
    left_over.write_bytes(b"from a previous run")
    env = stack_environment("redis://x", tmp_path / "metrics")
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "metrics")
    assert (tmp_path / "metrics").is_dir() and not left_over.exists()


def test_make_run_exports_volumes_with_the_loopback_test_image_unless_told_otherwise(
    monkeypatch, tmp_path
):
    """The demo's pools allow only the loopback registry: an export there must run its image."""
    monkeypatch.delenv("VOLUME_EXPORT_IMAGE", raising=False)
    env = stack_environment("redis://x", tmp_path / "metrics")
    assert env["VOLUME_EXPORT_IMAGE"] == TEST_IMAGE_TAG
    monkeypatch.setenv("VOLUME_EXPORT_IMAGE", "registry.lan/tools/busybox:1")
    env = stack_environment("redis://x", tmp_path / "metrics")
    assert env["VOLUME_EXPORT_IMAGE"] == "registry.lan/tools/busybox:1"
