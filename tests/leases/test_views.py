"""The console's leases page: a tenant reserves a future window (through the lease API's own
serializer and lease_reserve), sees it held, releases it; other tenants' leases stay unseen."""

from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import build_node, build_person, build_pool, build_tenant, cpu_request
from leases.models import Lease
from leases.services import lease_reserve
from pools.actors import Actor


@pytest.fixture
def setup(db, client):
    pool = build_pool("lab", name="Lab")
    tenant = build_tenant("vision", name="Vision")
    build_node(pool, "cpu-1", cpu=4000, memory=8192)
    client.force_login(build_person("alice", tenant=tenant))
    return pool, tenant


def window(hours_ahead=1, hours=2):
    start = (timezone.now() + timedelta(hours=hours_ahead)).replace(second=0, microsecond=0)
    end = start + timedelta(hours=hours)
    return start.strftime("%Y-%m-%dT%H:%M"), end.strftime("%Y-%m-%dT%H:%M")


def test_reserve_a_window_see_it_held_then_release_it(client, setup):
    start, end = window()
    response = client.post(
        "/console/leases",
        {
            "tenant": "vision",
            "pool": "lab",
            "cpu_millicores_min": "1000",
            "memory_mib_min": "1024",
            "start": start,
            "end": end,
            "tolerance_s": "600",
        },
    )
    lease = Lease.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"?reserved={lease.pk}")
    assert lease.state == "reserved" and lease.tolerance_s == 600 and lease.job_id is None
    assert timezone.localtime(lease.window_start).strftime("%Y-%m-%dT%H:%M") == start
    html = client.get(response["Location"]).content.decode()
    assert f"Reservation {lease.pk} is reserved on cpu-1" in html
    # what it holds, and from when: from the reserve, not from the window's start
    assert "It holds 1000 millicores and 1024 MiB from now until" in html
    form = client.get("/console/leases").content.decode()
    assert 'id="reserve-holds"' in form and "from the moment you reserve" in form
    assert f'<tr data-lease="{lease.pk}">' in html and "Reserved" in html
    row = client.post(f"/console/leases/{lease.pk}/release").content.decode()
    assert "Released" in row and "Release</button>" not in row
    lease.refresh_from_db()
    assert lease.state == "released"
    assert lease.events.last().reason == "released_by_client"


def test_a_bad_window_is_a_field_error_and_a_refused_one_says_why(client, setup):
    start, end = window()
    html = client.post(
        "/console/leases",
        {"tenant": "vision", "pool": "lab", "cpu_millicores_min": "1000", "memory_mib_min": "1"}
        | {"start": end, "end": start},
    ).content.decode()
    assert 'id="e-end"' in html and "must end after it starts" in html
    far_start, far_end = window(hours_ahead=24 * 30)
    response = client.post(
        "/console/leases",
        {"tenant": "vision", "pool": "lab", "cpu_millicores_min": "1000", "memory_mib_min": "1"}
        | {"start": far_start, "end": far_end},
    )
    assert response.status_code == 409
    assert "reservation_horizon_exceeded" in response.content.decode()
    assert not Lease.objects.exists()


def test_other_tenants_leases_are_unseen_and_unreleasable(
    client, setup, django_assert_max_num_queries
):
    pool, _ = setup
    other = build_tenant("nlp", name="Lang")
    theirs = lease_reserve(
        pool=pool,
        tenant=other,
        request=cpu_request(500, 256),
        actor=Actor.system("test"),
        duration=timedelta(minutes=5),
    )
    with django_assert_max_num_queries(10):
        html = client.get("/console/leases").content.decode()
    assert f'data-lease="{theirs.pk}"' not in html and "No leases yet" in html
    assert client.post(f"/console/leases/{theirs.pk}/release").status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == "reserved"


def test_a_reservation_row_names_the_jobs_that_run_in_it(client, setup):
    from config.builders import TEST_IMAGE_TAG
    from tests.clients import client_for

    pool, tenant = setup
    start = timezone.now() + timedelta(hours=1)
    held = lease_reserve(
        pool=pool,
        tenant=tenant,
        request=cpu_request(2000, 2048) | {"scratch_mib": 4096},
        actor=Actor.system("test"),
        duration=timedelta(minutes=5),
        window=(start, start + timedelta(hours=1)),
    )
    alice = client_for(build_person("alice2", tenant=tenant))
    body = {"tenant": "vision", "pool": "lab", "name": "in-it", "image": TEST_IMAGE_TAG}
    body |= {"resources": {"cpu_millicores_min": 500, "memory_mib_min": 256}}
    job = alice.post("/api/v1/jobs/", body | {"reservation": held.pk}, format="json").json()
    page = client.get("/console/leases").content.decode()
    row = page[page.index(f'data-lease="{held.pk}"') :].split("</tr>")[0]
    assert f'href="/console/jobs/{job["id"]}"' in row and "(queued)" in row
