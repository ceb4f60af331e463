"""`make run`: without Redis the embedded Redis-protocol server carries both real clients; the
local agent enrolls with a real token, or resumes with its stored credential."""

import asyncio

from celery import Celery
from channels_redis.core import RedisChannelLayer
from django.core.management import call_command

from config.management.commands.runstack import (
    _redis_answers,
    agent_command,
    agent_node_status,
    start_embedded_redis,
)
from nodes import services as node_services
from worker_agent.state import AgentState

INVENTORY = {"cpu_millicores": 2000, "memory_mib": 4096, "scratch_mib": 0, "gpus": []}


def test_embedded_redis_serves_the_channel_layer_and_the_celery_broker():
    url = start_embedded_redis()
    assert _redis_answers(url)

    async def live_event_round_trip():
        layer = RedisChannelLayer(hosts=[url])
        channel = await layer.new_channel()
        await layer.group_add("tenant-1", channel)
        await layer.group_send("tenant-1", {"type": "job.event", "event": {"job": 7}})
        return await asyncio.wait_for(layer.receive(channel), 5)

    assert asyncio.run(live_event_round_trip())["event"] == {"job": 7}
    with Celery(broker=url).connection() as connection:
        queue = connection.SimpleQueue("computepool-test")
        queue.put({"task": "scheduling.pass"})
        assert queue.get(timeout=5).payload == {"task": "scheduling.pass"}
        queue.close()


def test_an_unreachable_redis_is_detected():
    assert not _redis_answers("redis://127.0.0.1:1/0")


# --- the local agent `make run` starts beside the server ---------------------------------


def _flag(command: list, name: str):
    return command[command.index(name) + 1] if name in command else None


def test_a_fresh_agent_enrolls_into_its_pool_with_a_real_token(db, tmp_path):
    call_command("load_demo", verbosity=0)
    state = tmp_path / "agent" / "dev"
    command, said = agent_command(api="http://x", pool="dev", runtime="process", state_dir=state)
    assert command[1:3] == ["-m", "worker_agent"] and _flag(command, "--runtime") == "process"
    assert _flag(command, "--state-dir") == str(state) and state.is_dir()
    name = _flag(command, "--node-name")
    assert said == f"enrolls as {name}"
    node, _, _ = node_services.node_enroll(
        secret=_flag(command, "--enroll-token"), name=name, inventory=INVENTORY
    )
    assert node.pool.slug == "dev"
    # The same name again (its state dir was lost): a new name, names are unique in a pool.
    command, _ = agent_command(api="http://x", pool="dev", runtime="process", state_dir=state)
    assert _flag(command, "--node-name") == f"{name}-2"


def test_an_enrolled_agent_resumes_and_its_state_is_shown(db, tmp_path):
    call_command("load_demo", verbosity=0)
    state = tmp_path / "lab"
    command, _ = agent_command(api="http://x", pool="lab", runtime="docker", state_dir=state)
    node, secret, _ = node_services.node_enroll(
        secret=_flag(command, "--enroll-token"), name="local-a", inventory=INVENTORY
    )
    AgentState(state).save_credential({"credential": secret})
    AgentState(state).save_node({"id": node.pk, "name": node.name})
    command, said = agent_command(api="http://x", pool="lab", runtime="docker", state_dir=state)
    assert said == "resumes its enrolled node" and "--enroll-token" not in command
    status = agent_node_status(state)
    assert status == "node local-a in pool lab: registered, reachable, no heartbeat yet"


def test_a_credential_of_another_database_is_dropped(db, tmp_path):
    call_command("load_demo", verbosity=0)
    state = tmp_path / "lab"
    AgentState(state).save_credential({"credential": "cpn_from_elsewhere"})
    AgentState(state).save_node({"id": 999999, "name": "gone"})
    command, said = agent_command(api="http://x", pool="lab", runtime="docker", state_dir=state)
    assert said.startswith("enrolls as") and _flag(command, "--enroll-token")
    assert not (state / "credential").exists()
