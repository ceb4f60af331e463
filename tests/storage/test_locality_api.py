"""A node's storage report (docs/storage.md, "Scratch on disk" and "Data locality"): what its
heartbeat says of its disk, its caches and its downloads. Hostile reports are a 400 that
changes nothing; the scheduler's scratch follows the real disk, never below what is reserved,
and a disk short of its reservations is reported once and takes no new scratch."""

import pytest
from django.db.models import F

from nodes import services
from nodes.models import Node, NodeEvent
from pools.actors import Actor
from tests.clients import bearer_client, client_for

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
GIB = 1024 * MIB
IMAGE = "sha256:" + "b" * 64
INPUT = "https://data.example/sets/train.tar"

HEARTBEAT = "/api/v1/agent/heartbeat/"
OK_DISK = {"total_bytes": 100 * GIB, "free_bytes": 50 * GIB, "held_bytes": 0}
HOSTILE = {
    "too many inputs": {
        "cache": {"inputs": [{"key": f"{INPUT}{i}", "bytes": 1} for i in range(1025)]}
    },
    "too many images": {
        "cache": {"images": [{"digest": f"sha256:{i:064x}", "bytes": 1} for i in range(513)]}
    },
    "a huge key": {"cache": {"inputs": [{"key": INPUT + "x" * 5000, "bytes": 1}]}},
    "a key that is no URL": {"cache": {"inputs": [{"key": "/etc/passwd", "bytes": 1}]}},
    "a control character": {"cache": {"inputs": [{"key": INPUT + "\n", "bytes": 1}]}},
    "a negative size": {"cache": {"images": [{"digest": IMAGE, "bytes": -1}]}},
    "a size past a TiB": {"cache": {"images": [{"digest": IMAGE, "bytes": 2**41}]}},
    "not a digest": {"cache": {"images": [{"digest": "sha256:xyz", "bytes": 1}]}},
    "a key listed twice": {
        "cache": {"inputs": [{"key": INPUT, "bytes": 1}, {"key": INPUT, "bytes": 2}]}
    },
    "an unknown field": {"cache": {"images": [], "secrets": []}},
    "a size as a string": {"cache": {"images": [{"digest": IMAGE, "bytes": "12"}]}},
    "free past the disk": {"disk": OK_DISK | {"free_bytes": 101 * GIB}},
    "negative free": {"disk": OK_DISK | {"free_bytes": -1}},
    "held past the disk": {"disk": OK_DISK | {"held_bytes": 101 * GIB}},
    "a disk without its size": {"disk": {"free_bytes": 1, "held_bytes": 0}},
    "too many downloads": {
        "downloads": [{"key": INPUT, "bytes": 1, "seconds": 1}] * 65,
    },
    "negative seconds": {"downloads": [{"key": INPUT, "bytes": 1, "seconds": -1}]},
}

WATCHED = (
    "last_heartbeat_at",
    "usage",
    "cached_data",
    "cached_images",
    "pull_bytes_per_s",
    "download_bytes_per_s",
    "input_download_seconds",
    "scratch_mib_allocatable",
    "disk_free_mib",
    "disk_reported_at",
)


def state(node):
    return Node.objects.filter(pk=node.pk).values(*WATCHED).get()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_storage_report_is_a_400_and_changes_nothing(agent, name):
    client = bearer_client(agent.secret)
    assert client.post(HEARTBEAT, {"disk": OK_DISK}, format="json").status_code == 200
    before = state(agent.node)
    body = {"usage": {"cpu_percent": 99}, "images": [IMAGE]} | HOSTILE[name]
    response = client.post(HEARTBEAT, body, format="json")
    assert response.status_code == 400, response.content
    assert len(response.content) < 8000  # a few problems named, never the value echoed back
    assert state(agent.node) == before


def test_the_cache_report_is_stored_with_sizes_and_the_throughputs_measured(agent):
    client = bearer_client(agent.secret)
    services.node_image_pull_record(node=agent.node, image=f"reg/x@{IMAGE}", seconds=4.0)
    body = {
        "images": [IMAGE],
        "cache": {
            "images": [{"digest": IMAGE, "bytes": 400_000_000}],
            "inputs": [{"key": INPUT, "bytes": 2_000_000}],
        },
        "downloads": [{"key": INPUT, "bytes": 2_000_000, "seconds": 0.5}],
    }
    assert client.post(HEARTBEAT, body, format="json").status_code == 200
    node = Node.objects.get(pk=agent.node.pk)
    assert node.cached_data == {IMAGE: 400_000_000, INPUT: 2_000_000}
    assert node.pull_bytes_per_s == 100_000_000  # 400 MB in 4 s
    assert node.download_bytes_per_s == 4_000_000
    assert node.input_download_seconds == {INPUT: 0.5}
    # the next download moves the figure halfway toward what it measured
    body = {"downloads": [{"key": INPUT, "bytes": 1_000_000, "seconds": 0.5}]}
    assert client.post(HEARTBEAT, body, format="json").status_code == 200
    assert Node.objects.get(pk=agent.node.pk).download_bytes_per_s == 3_000_000
    # a heartbeat without the cache keeps it; an empty one empties it
    assert client.post(HEARTBEAT, {}, format="json").status_code == 200
    assert Node.objects.get(pk=agent.node.pk).cached_data == {IMAGE: 400_000_000, INPUT: 2_000_000}
    empty = {"cache": {"images": [], "inputs": []}}
    assert client.post(HEARTBEAT, empty, format="json").status_code == 200
    assert Node.objects.get(pk=agent.node.pk).cached_data == {}


def reserve_scratch(node, mib):
    """As the ledger's guarded write would (the check constraint holds)."""
    assert Node.objects.filter(
        pk=node.pk, scratch_mib_reserved__lte=F("scratch_mib_allocatable") - mib
    ).update(scratch_mib_reserved=F("scratch_mib_reserved") + mib)


def disk(free_gib, held_gib=0, total_gib=2000):
    return {
        "total_bytes": total_gib * GIB,
        "free_bytes": free_gib * GIB,
        "held_bytes": held_gib * GIB,
    }


def test_scratch_follows_the_real_disk_never_below_what_is_reserved(agent):
    node, actor = agent.node, Actor.for_node(agent.node)
    pool = node.pool
    keep = (100 - pool.safety_margin_percent) / 100
    from_inventory = int(node.scratch_mib_raw * keep)
    heartbeat = lambda d: services.node_heartbeat(node=node, actor=actor, disk=d)  # noqa: E731

    # the disk holds less than the inventory says: allocatable is what it really holds
    heartbeat(disk(free_gib=100))
    node.refresh_from_db()
    ceiling = int(100 * 1024 * keep)
    assert node.scratch_mib_allocatable == min(from_inventory, ceiling) == ceiling
    assert (node.disk_total_mib, node.disk_free_mib, node.disk_held_mib) == (2000 * 1024, 102400, 0)

    # a job reserves 60 GiB and writes 40 of them: free drops, held rises, the ceiling stays
    reserve_scratch(node, 60 * 1024)
    heartbeat(disk(free_gib=60, held_gib=40))
    node.refresh_from_db()
    assert node.scratch_mib_allocatable == ceiling and not node.disk_short

    # something else fills the disk: the disk can no longer hold what is reserved
    heartbeat(disk(free_gib=5, held_gib=40))
    node.refresh_from_db()
    assert node.disk_short
    assert node.scratch_mib_allocatable == node.scratch_mib_reserved == 60 * 1024  # never below
    assert node.scratch_mib_allocatable - node.scratch_mib_reserved == 0  # no new scratch
    events = NodeEvent.objects.filter(node=node, reason="disk_short")
    assert events.count() == 1
    assert events.get().data["reserved_mib"] == 60 * 1024
    heartbeat(disk(free_gib=4, held_gib=40))  # still short: not reported again
    assert NodeEvent.objects.filter(node=node, reason="disk_short").count() == 1

    # the space comes back: recovered, once, and the scratch with it
    heartbeat(disk(free_gib=60, held_gib=40))
    node.refresh_from_db()
    assert not node.disk_short and node.scratch_mib_allocatable == ceiling
    assert NodeEvent.objects.filter(node=node, reason="disk_recovered").count() == 1


def test_operators_read_a_nodes_disk_and_transfer_figures_in_the_node_api(agent, operator):
    node, actor = agent.node, Actor.for_node(agent.node)
    services.node_heartbeat(
        node=node,
        actor=actor,
        disk=disk(free_gib=60, held_gib=40),
        downloads=[{"key": INPUT, "bytes": 6_000_000, "seconds": 2.0}],
    )
    body = client_for(operator).get(f"/api/v1/nodes/{node.pk}/").json()
    assert (body["disk_total_mib"], body["disk_free_mib"], body["disk_held_mib"]) == (
        2000 * 1024,
        60 * 1024,
        40 * 1024,
    )
    assert body["disk_reported_at"] and body["disk_short"] is False
    assert body["download_bytes_per_s"] == 3_000_000
    assert body["input_download_seconds"] == {INPUT: 2.0}


def test_the_inventory_reconciliation_keeps_to_the_disk_ceiling(agent):
    node, actor = agent.node, Actor.for_node(agent.node)
    services.node_heartbeat(node=node, actor=actor, disk=disk(free_gib=10))
    node.refresh_from_db()
    ceiling = node.scratch_mib_allocatable
    inventory = dict(node.inventory) | {"scratch_mib": node.inventory["scratch_mib"] * 2}
    services.node_inventory_report(node=node, inventory=inventory)
    services.node_inventory_reconcile(node=node, actor=Actor.system("test"))
    node.refresh_from_db()
    assert node.scratch_mib_raw == inventory["scratch_mib"]  # the drift is taken …
    assert node.scratch_mib_allocatable == ceiling  # … but never past what the disk holds


def test_the_snapshot_reads_only_the_cache_entries_the_requests_need(agent):
    from leases import snapshot

    other = "https://data.example/other"
    Node.objects.filter(pk=agent.node.pk).update(
        cached_data={IMAGE: 5, INPUT: 7, other: 9}, pull_bytes_per_s=2.5
    )
    pool = agent.node.pool_id
    [view] = snapshot.pool_snapshot(pool, data_keys={INPUT, "sha256:" + "c" * 64}).nodes
    assert view.cached_data == frozenset({(INPUT, 7)}) and view.pull_bytes_per_s == 2.5
    [view] = snapshot.pool_snapshot(pool).nodes  # no keys asked: nothing of the cache read
    assert view.cached_data == frozenset()
    assert snapshot.input_keys([{"url": INPUT + "#x", "name": "a"}, {"url": "s3://b/k"}]) == (
        INPUT,
    )
    signed = {"url": INPUT + "?X-Amz-Signature=abc", "name": "a", "presigned": True}
    assert snapshot.input_keys([signed]) == (INPUT,)
