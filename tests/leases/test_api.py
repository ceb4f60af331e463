"""The leases API: every endpoint anonymous, wrong role, right role; refusals are 4xx, never 500."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, build_node, build_pool, build_tenant, cpu_request
from leases.choices import LeaseState
from leases.models import Lease
from leases.selectors import ledger_problems
from pools.models import ResourceShape
from tests.clients import client_for

URL = "/api/v1/compute-leases"


def body(pool, tenant, **extra):
    data = {
        "pool": pool.slug,
        "tenant": tenant.slug,
        "resources": {"cpu_millicores_min": 1000, "memory_mib_min": 1024},
        "duration_s": 300,
    }
    data.update(extra)
    return data


@pytest.fixture
def granted(lpool, ltenant, lnode, lmember):
    response = client_for(lmember).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_create_anonymous_wrong_role_right_role(lpool, ltenant, lnode, lmember, loutsider):
    assert client_for().post(URL, body(lpool, ltenant), format="json").status_code in (401, 403)
    # a member of another tenant: the tenant is invisible to them
    response = client_for(loutsider).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 400 and "tenant" in response.json()
    # a read-only token may not reserve
    response = client_for(lmember, scopes=("read",)).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 403
    # a node's agent may not reserve
    response = client_for(node=lnode).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code in (401, 403)
    response = client_for(lmember).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201
    lease = response.json()
    assert lease["state"] == "reserved" and lease["node"] == "n1"
    assert lease["cpu_millicores"] == 1000 and lease["fencing_token"]
    assert lease["held"]["cpu_millicores"] == 1000 and lease["consumed"] is None
    assert ledger_problems(lpool) == []


def test_create_trailing_slash_and_catalogue_shape(lpool, ltenant, lnode, lmember):
    ResourceShape.objects.create(
        pool=lpool, name="small", cpu_millicores_min=500, memory_mib_min=512
    )
    data = body(lpool, ltenant, shape="small")
    del data["resources"]
    response = client_for(lmember).post(URL + "/", data, format="json")
    assert response.status_code == 201 and response.json()["cpu_millicores"] == 500


def test_operator_may_reserve_for_any_tenant(lpool, ltenant, lnode, loperator):
    response = client_for(loperator).post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201


@pytest.mark.parametrize(
    "change, field",
    [
        ({"pool": "nope"}, "pool"),
        ({"tenant": "nope"}, "tenant"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": "x"}, "duration_s"),
        ({"resources": {"cpu_millicores_min": 0, "memory_mib_min": 1}}, "resources"),
        ({"resources": {"memory_mib_min": 1}}, "resources"),
        (
            {"resources": {"cpu_millicores_min": 1, "memory_mib_min": 1, "gpu_count": 1}},
            "resources",
        ),
        ({"resources": "lots"}, "resources"),
        ({"shape": "missing"}, "shape"),
        ({"window": {"start": "2030-01-01T00:00:00Z", "end": "2029-01-01T00:00:00Z"}}, "window"),
        ({"window": "tomorrow"}, "window"),
    ],
)
def test_bad_input_is_400_with_field_errors(lpool, ltenant, lnode, lmember, change, field):
    data = {**body(lpool, ltenant), **change}
    response = client_for(lmember).post(URL, data, format="json")
    assert response.status_code == 400, response.content
    payload = response.json()
    assert field in payload or "shape" in payload or "non_field_errors" in payload


def test_no_body_and_garbage_are_400(lpool, ltenant, lnode, lmember):
    client = client_for(lmember)
    assert client.post(URL, {}, format="json").status_code == 400
    response = client.post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400


def test_409_with_reasons_and_422_never_fits(lpool, ltenant, lnode, lmember):
    client = client_for(lmember)
    big = {"cpu_millicores_min": 4000, "memory_mib_min": 1024}
    holder = client.post(URL, body(lpool, ltenant, resources=big), format="json")
    assert holder.status_code == 201
    response = client.post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 409
    payload = response.json()
    assert payload["code"] == "no_capacity"
    assert payload["reasons"] == {"insufficient_cpu": 1}
    assert payload["message"].startswith("0 of 1 nodes")
    # when it would fit: once the holding lease ends
    near = payload["nearest_miss"]
    assert near["node"] == "n1" and near["fits_on"] == "n1"
    assert near["after_leases"] == [str(holder.json()["id"])]
    assert near["fits_at"][:19] == holder.json()["expires_at"][:19]
    huge = {"cpu_millicores_min": 400_000, "memory_mib_min": 1024}
    response = client.post(URL, body(lpool, ltenant, resources=huge), format="json")
    assert response.status_code == 422 and response.json()["code"] == "never_fits"


def test_quota_refusal_is_409(lpool, ltenant, lnode, lmember):
    from pools.models import Quota

    Quota.objects.create(tenant=ltenant, pool=lpool, cpu_millicores=1000, memory_mib=10**6)
    client = client_for(lmember)
    assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201
    response = client.post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 409 and response.json()["code"] == "quota_exceeded"


def test_idempotency_key_returns_the_same_lease(lpool, ltenant, lnode, lmember):
    client = client_for(lmember)
    first = client.post(URL, body(lpool, ltenant), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    second = client.post(URL, body(lpool, ltenant), format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201 and second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Lease.objects.count() == 1


def test_window_creates_a_reservation(lpool, ltenant, lnode, lmember):
    start = timezone.now() + timedelta(hours=1)
    window = {
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
        "tolerance_s": 120,
    }
    response = client_for(lmember).post(URL, body(lpool, ltenant, window=window), format="json")
    assert response.status_code == 201
    assert response.json()["window_start"] and response.json()["tolerance_s"] == 120
    far = {
        "start": (timezone.now() + timedelta(days=60)).isoformat(),
        "end": (timezone.now() + timedelta(days=60, hours=1)).isoformat(),
    }
    response = client_for(lmember).post(URL, body(lpool, ltenant, window=far), format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "reservation_horizon_exceeded"


def test_list_and_detail_visibility(granted, lmember, loutsider, loperator, lnode, lpool):
    lease_url = f"{URL}/{granted['id']}"
    assert client_for().get(URL).status_code in (401, 403)
    assert client_for(loutsider).get(URL).json()["count"] == 0
    assert client_for(loutsider).get(lease_url).status_code == 404
    assert client_for(lmember).get(URL).json()["count"] == 1
    assert client_for(lmember).get(lease_url).json()["id"] == granted["id"]
    assert client_for(loperator).get(lease_url).status_code == 200
    assert client_for(node=lnode).get(lease_url).status_code == 200
    other = build_node(lpool, "n2")
    assert client_for(node=other).get(lease_url).status_code == 404
    events = client_for(lmember).get(f"{lease_url}/events").json()
    assert [e["reason"] for e in events] == ["reserved"]


def test_commit_renew_release_roles(granted, lmember, loutsider, lnode, lpool):
    lease_url = f"{URL}/{granted['id']}"
    token = {"fencing_token": granted["fencing_token"]}
    other = build_node(lpool, "n2")
    for action in ("commit", "renew", "release"):
        assert client_for().post(f"{lease_url}/{action}", token).status_code in (401, 403)
        assert client_for(loutsider).post(f"{lease_url}/{action}", token).status_code == 404
        assert client_for(node=other).post(f"{lease_url}/{action}", token).status_code == 404
    read_only = client_for(lmember, scopes=("read",))
    assert read_only.post(f"{lease_url}/commit", token).status_code == 403
    stale = client_for(node=lnode).post(f"{lease_url}/commit", {"fencing_token": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "fencing_token_mismatch"
    assert client_for(node=lnode).post(f"{lease_url}/commit", {}).status_code == 400
    committed = client_for(node=lnode).post(f"{lease_url}/commit", token)
    assert committed.status_code == 200 and committed.json()["state"] == "committed"
    renewed = client_for(lmember).post(f"{lease_url}/renew", {**token, "duration_s": 900})
    assert renewed.status_code == 200
    again = client_for(node=lnode).post(f"{lease_url}/commit", token)
    assert again.status_code == 409 and again.json()["code"] == "transition_not_allowed"
    usage = {"cpu_millicores": 700, "memory_mib": 512}
    assert client_for(lmember).post(f"{lease_url}/usage", usage).status_code == 403
    # a node reports with the lease's fencing token (a stale attempt cannot report its successor)
    reported = client_for(node=lnode).post(f"{lease_url}/usage", {**usage, **token})
    assert reported.status_code == 200 and reported.json()["consumed"]["cpu_millicores"] == 700
    released = client_for(lmember).post(f"{lease_url}/release", {})
    assert released.status_code == 200 and released.json()["state"] == "released"
    # idempotent
    assert client_for(node=lnode).post(f"{lease_url}/release", token).status_code == 200
    assert Lease.objects.get(pk=granted["id"]).state == LeaseState.RELEASED
    assert ledger_problems(lpool) == []


def test_accounting_and_capacity(granted, lmember, loutsider, loperator, lpool):
    own = client_for(lmember).get(f"{URL}/accounting").json()
    assert [row["tenant"] for row in own] == ["lt"]
    assert own[0]["held"]["cpu_millicores"] == 1000
    assert client_for(loutsider).get(f"{URL}/accounting").json()[0]["held"]["leases"] == 0
    capacity_url = f"/api/v1/pools/{lpool.slug}/capacity"
    assert client_for().get(capacity_url).status_code in (401, 403)
    assert client_for(lmember).get(capacity_url).status_code == 403
    response = client_for(loperator).get(capacity_url)
    assert response.status_code == 200
    totals = response.json()["totals"]
    assert totals["reserved"]["cpu_millicores"] == 1000
    assert totals["allocatable"]["cpu_millicores"] == 4000
    assert client_for(loperator).get("/api/v1/pools/none/capacity").status_code == 404


# --- the reserve hot path: cached validation, group commit --------------------------------------


def test_membership_removed_elsewhere_is_refused_after_the_ttl(
    lpool, ltenant, lnode, lmember, monkeypatch
):
    from leases.api import views
    from pools.models import Membership

    now = [1000.0]
    monkeypatch.setattr(views, "_clock", lambda: now[0])
    views.forget_validated_bodies()
    client = client_for(lmember)
    small = {"cpu_millicores_min": 100, "memory_mib_min": 64}
    assert client.post(URL, body(lpool, ltenant, resources=small), format="json").status_code == 201
    # removed by another process (no signal here): the cached answer lasts until its TTL ends
    Membership.objects.filter(user=lmember)._raw_delete("default")
    now[0] += views.CREATE_CACHE_SECONDS - 0.1
    assert client.post(URL, body(lpool, ltenant, resources=small), format="json").status_code == 201
    now[0] += 0.2
    response = client.post(URL, body(lpool, ltenant, resources=small), format="json")
    assert response.status_code == 400 and "tenant" in response.json()


def test_membership_removed_in_this_process_is_refused_at_once(lpool, ltenant, lnode, lmember):
    from pools.models import Membership

    client = client_for(lmember)
    small = {"cpu_millicores_min": 100, "memory_mib_min": 64}
    assert client.post(URL, body(lpool, ltenant, resources=small), format="json").status_code == 201
    Membership.objects.filter(user=lmember).delete()
    response = client.post(URL, body(lpool, ltenant, resources=small), format="json")
    assert response.status_code == 400 and "tenant" in response.json()


def test_cached_body_still_gets_field_errors_for_bad_variants(lpool, ltenant, lnode, lmember):
    client = client_for(lmember)
    assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201
    response = client.post(URL, body(lpool, ltenant, duration_s=0), format="json")
    assert response.status_code == 400 and "duration_s" in response.json()
    assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_group_commit_batches_concurrent_reserves_without_overcommit():
    """Threads (own connections) reserve at once: the combiner applies them in batches, each
    lease with its own event; the losers get 409 reasons; the ledger holds."""
    import threading
    import time

    from django.db import connection

    from leases import selectors, services
    from leases.models import LeaseEvent
    from leases.services import ledger

    pool = build_pool("batch", exact_capacity=True)
    tenant = build_tenant("b", name="B")
    build_node(pool, "b1", cpu=4000, memory=8192)
    build_node(pool, "b2", cpu=3000, memory=8192)
    sizes = []

    def slow_first_write(rows):
        sizes.append(len(rows))
        if len(sizes) == 1:
            time.sleep(0.3)  # let the other threads queue up behind the first leader

    granted, refused, errors = [], [], []
    barrier = threading.Barrier(12)

    def client():
        try:
            barrier.wait()
            lease = services.lease_reserve(
                pool=pool,
                tenant=tenant,
                request=cpu_request(1000, 1024),
                actor=SYSTEM,
                duration=timedelta(minutes=5),
            )
            granted.append(lease.pk)
        except services.NoCapacity as exc:
            refused.append(exc.explanation["reasons"])
        except Exception as exc:  # reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=client) for _ in range(12)]
    with ledger.race_hook(ledger.BEFORE_WRITES, slow_first_write):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert errors == []
    assert len(granted) == 7 and len(refused) == 5
    assert all(reasons for reasons in refused)
    assert max(sizes) > 1  # combined: one ledger write for the leases of several reserves
    assert selectors.overcommitted_nodes(pool) == 0
    assert ledger_problems(pool) == []
    leases = Lease.objects.filter(pk__in=granted)
    assert all(lease.state == LeaseState.RESERVED for lease in leases)
    events = LeaseEvent.objects.filter(lease__in=leases, reason="reserved")
    assert sorted(events.values_list("lease_id", flat=True)) == sorted(granted)


@pytest.mark.django_db(transaction=True)
def test_group_commit_keeps_each_reserves_own_times_and_actor():
    """A batch builds the columns its leases share once per actor, but each lease keeps its own
    request's times (created, state changed, expiry) and its event its own time and actor."""
    import threading
    import time

    from django.db import connection

    from leases import services
    from leases.models import LeaseEvent
    from leases.services import ledger
    from pools.actors import Actor

    pool = build_pool("own-times", exact_capacity=True)
    tenant = build_tenant("o", name="O")
    build_node(pool, "o1", cpu=64000, memory=65536)
    base = timezone.now().replace(microsecond=0)
    asks = [
        (base + timedelta(seconds=i), timedelta(minutes=1 + i), Actor.system(f"caller-{i % 2}"))
        for i in range(8)
    ]
    sizes, granted, errors = [], {}, []

    def slow_first_write(rows):
        sizes.append(len(rows))
        if len(sizes) == 1:
            time.sleep(0.3)  # the others queue up behind the first leader

    barrier = threading.Barrier(len(asks))

    def client(i):
        now, duration, actor = asks[i]
        try:
            barrier.wait()
            granted[i] = services.lease_reserve(
                pool=pool,
                tenant=tenant,
                request=cpu_request(100, 64),
                actor=actor,
                duration=duration,
                now=now,
            )
        except Exception as exc:  # reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(asks))]
    with ledger.race_hook(ledger.BEFORE_WRITES, slow_first_write):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert errors == [] and len(granted) == len(asks)
    assert max(sizes) > 1  # some of them were combined
    for i, returned in granted.items():
        now, duration, actor = asks[i]
        lease = Lease.objects.get(pk=returned.pk)
        for seen in (returned, lease):
            assert seen.created_at == now and seen.state_changed_at == now
            assert seen.expires_at == now + duration
        event = LeaseEvent.objects.get(lease=lease, reason="reserved")
        assert event.at == now and event.actor_label == actor.label
    assert ledger_problems(pool) == []


@pytest.mark.django_db(transaction=True)
def test_group_commit_conflict_is_replanned():
    """A batch planned on a snapshot gone stale: another writer takes the node it chose before
    its guarded write (the ledger's race hook), which matches nothing; the request is
    re-planned on a fresh snapshot (attempt 2) and lands on the node that still has room."""
    from django.db import transaction

    from leases import services
    from leases.services import ledger

    pool = build_pool("stale", exact_capacity=True)
    tenant = build_tenant("s", name="S")
    build_node(pool, "s1", cpu=1000, memory=8192)
    build_node(pool, "s2", cpu=1000, memory=8192)
    taken = []

    def another_writer_first(rows):
        if not taken:  # the batch's write: someone else takes a node meanwhile
            with transaction.atomic():  # inside a transaction: not combined, applied at once
                other = services.lease_reserve(
                    pool=pool,
                    tenant=tenant,
                    request=cpu_request(1000, 1024),
                    actor=SYSTEM,
                    duration=timedelta(minutes=5),
                )
            taken.append(other.node.name)

    with ledger.race_hook(ledger.BEFORE_WRITES, another_writer_first):
        lease = services.lease_reserve(
            pool=pool,
            tenant=tenant,
            request=cpu_request(1000, 1024),
            actor=SYSTEM,
            duration=timedelta(minutes=5),
        )
    # both nodes are alike: the same policy picked the same node on the same (stale) view
    assert lease.placement["attempts"] == 2 and lease.node.name != taken[0]
    assert ledger_problems(pool) == []


def test_a_repeated_reserve_costs_a_fixed_handful_of_statements(lpool, ltenant, lnode, lmember):
    """The hot path stays a few round trips whatever the pool holds: no query per node, per
    lease or per field creeps in (the latency target depends on it)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for i in range(8):
        build_node(lpool, f"extra-{i}", cpu=8000, memory=16384)
    client = client_for(lmember)
    for _ in range(3):  # warm the per-process caches (token, validated body, policy)
        assert client.post(URL, body(lpool, ltenant), format="json").status_code == 201
    with CaptureQueriesContext(connection) as queries:
        response = client.post(URL, body(lpool, ltenant), format="json")
    assert response.status_code == 201
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    # the snapshot and the one guarded statement that takes the node's capacity and inserts the
    # lease and its event (a tenant without quota or credit account, as the per-process cache
    # knows, needs no quota statement); SAVEPOINT/RELEASE are the test's own transaction
    # (outside a test: BEGIN travels with the first, then COMMIT)
    work = [s for s in statements if s not in ("SAVEPOINT", "RELEASE")]
    assert work == ["SELECT", "WITH"], statements
