"""The database adapter of the core: holding leases' end times in the snapshot."""

from datetime import timedelta

from django.utils import timezone

from config.builders import SYSTEM, build_node, cpu_request, gpu_request
from leases import services, snapshot, snapshot_rows
from leases.node_views import lease_ends
from placement import place
from placement import types as core
from pools.reasons import Reason


def test_snapshot_lists_holding_leases_with_their_end_and_what_they_free(lpool, ltenant):
    build_node(lpool, "g1", cpu=8000, memory=16384, gpus=[{}, {}])
    now = timezone.now()
    first = services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=gpu_request(count=1, cpu=2000, memory=4096),
        actor=SYSTEM,
        duration=timedelta(hours=1),
        now=now,
    )
    second = services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=cpu_request(1000, 1024),
        actor=SYSTEM,
        duration=timedelta(minutes=30),
        now=now,
    )
    gone = services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=cpu_request(500, 512),
        actor=SYSTEM,
        duration=timedelta(minutes=10),
        now=now,
    )
    services.lease_release(lease=gone, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)

    (node,) = snapshot.pool_snapshot(lpool.pk).nodes
    assert [x.lease_id for x in node.leases] == [str(second.pk), str(first.pk)]  # earliest first
    by_id = {x.lease_id: x for x in node.leases}
    held = by_id[str(first.pk)]
    assert held.ends_at == first.expires_at
    assert (held.cpu_millicores, held.memory_mib) == (2000, 4096)
    assert held.gpu_milli == ((first.gpu_allocations[0]["index"], 1000),)
    assert by_id[str(second.pk)].gpu_milli == ()
    # An empty view (what the pool could ever offer) carries no leases.
    assert snapshot.pool_snapshot(lpool.pk, empty=True).nodes[0].leases == ()

    # The explanation of a request that does not fit now names the lease to wait for.
    req = snapshot.core_request(gpu_request(count=2, cpu=2000, memory=4096), ltenant.pk)
    result = place(req, [node], snapshot.pool_policy(lpool))
    assert isinstance(result, core.Explanation)
    assert result.nearest_miss.fits_at == first.expires_at
    assert result.nearest_miss.after_leases == (str(first.pk),)
    assert f"when lease {first.pk} ends at" in result.message


def test_portable_read_matches_the_postgresql_query(lpool, ltenant, settings):
    """SQLite (`make run`) reads the snapshot through the ORM; it must see the same pool."""
    build_node(lpool, "g1", cpu=8000, memory=16384, gpus=[{}, {"sharing_mode": "timeslice"}])
    build_node(lpool, "c1", cpu=4000, memory=8192, features=["avx512", "sgx"])
    for request in (gpu_request(count=1), gpu_request("timeslice", milli=250), cpu_request()):
        services.lease_reserve(
            pool=lpool, tenant=ltenant, request=request, actor=SYSTEM, duration=600
        )
    scope = {"leases": True, "reachable_only": False, "work": True}
    fast_rows, fast_gpus = snapshot_rows.read(lpool.pk, ["ready"], **scope)
    settings.LEASE_PORTABLE_PATHS = True  # the one switch: what a SQLite deployment reads
    rows, gpus = snapshot_rows.read(lpool.pk, ["ready"], **scope)
    assert gpus == fast_gpus

    def comparable(row):
        return row | {
            "leases": [
                lease | {"ends_at": lease_ends([lease])[0].ends_at} for lease in row["leases"]
            ]
        }

    assert [comparable(r) for r in rows] == [comparable(r) for r in fast_rows]
    assert sum(len(r["leases"]) for r in rows) == 3
    assert [r["features"] for r in rows] == [["avx512", "sgx"], []]  # c1, g1: by name


def test_the_snapshot_reads_node_features_and_only_their_strings(lpool):
    """What the API validates is what nodes send now; a value stored before (or by an admin
    edit) that holds other things is read for its strings, never a failed snapshot."""
    from nodes.models import Node

    build_node(lpool, "valid", features=["avx512"])
    odd = build_node(lpool, "odd")
    Node.objects.filter(pk=odd.pk).update(features=["sgx", {"x": 1}, 5, ["avx512"]])
    build_node(lpool, "not-a-list")
    Node.objects.filter(name="not-a-list").update(features={"avx512": True})
    views = {node.name: node.features for node in snapshot.pool_snapshot(lpool.pk).nodes}
    assert views == {
        "valid": frozenset({"avx512"}),
        "odd": frozenset({"sgx"}),
        "not-a-list": frozenset(),
    }
