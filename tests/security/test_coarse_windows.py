"""Issue #17: no explanation tells when another tenant's lease ends. The other tenant holds
the only node with a lease ending at a known minute; the member asks every explanation there
is (a refused reserve, a queued job's pending reason, explain, the console's explain panel and
preview, the forecast) and finds a coarse window, never that minute. Its own leases' ends are
still told exactly."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from config.builders import SYSTEM, TEST_IMAGE_TAG, build_node, build_pool, cpu_request
from jobs.models import Job
from leases import services
from placement.explain import coarse_window
from scheduling import forecast
from scheduling.passes import scheduling_pass
from tests.clients import client_for

LEASES = "/api/v1/compute-leases"
JOBS = "/api/v1/jobs"


@pytest.fixture
def wpool(db):
    return build_pool("windows", exact_capacity=True)


@pytest.fixture
def wnode(wpool):
    return build_node(wpool, "n1", cpu=4000, memory=8192)


def hold(pool, tenant, minutes: int):
    """A lease of `tenant` filling the node, ending in `minutes` (at second 0 of a minute)."""
    return services.lease_reserve(
        pool=pool,
        tenant=tenant,
        request=cpu_request(cpu=4000, memory=1024),
        actor=SYSTEM,
        duration=timedelta(minutes=minutes),
    )


def traces(moment) -> list[str]:
    """Every way a text could tell `moment` (UTC): ISO to the minute, HH:MM, a date and time."""
    return [moment.isoformat()[:16], f"{moment:%H:%M}", f"{moment:%Y-%m-%d %H:%M}"]


def assert_untold(text: str, moment):
    for trace in traces(moment):
        assert trace not in text, (trace, text[:2000])


@pytest.mark.parametrize(("minutes", "window"), [(17, "within the hour"), (150, "in 1–4 hours")])
def test_no_explanation_tells_when_another_tenants_lease_ends(
    wpool, wnode, tenant, other_tenant, member, client, minutes, window
):
    theirs = hold(wpool, other_tenant, minutes)
    api = client_for(member)
    request = {"cpu_millicores_min": 1000, "memory_mib_min": 1024}

    refused = api.post(
        LEASES,
        {"pool": "windows", "tenant": "vision", "resources": request, "duration_s": 60},
        format="json",
    )
    assert refused.status_code == 409
    near = refused.json()["nearest_miss"]
    assert near["fits_at"] is None and near["fits_within"] == window
    assert f"when capacity frees up {window}" in refused.json()["message"]
    assert_untold(refused.content.decode(), theirs.expires_at)

    body = {"tenant": "vision", "pool": "windows", "name": "waits", "image": TEST_IMAGE_TAG}
    job = api.post(JOBS, body | {"resources": request}, format="json").json()
    scheduling_pass()
    shown = api.get(f"{JOBS}/{job['id']}")
    reason = shown.json()["pending_reason"]
    assert reason["nearest_miss"]["fits_within"] == window and window in reason["message"]
    explained = api.get(f"{JOBS}/{job['id']}/explain")
    assert explained.json()["now"]["nearest_miss"]["fits_within"] == window
    for response in (shown, explained):
        assert_untold(response.content.decode(), theirs.expires_at)

    client.force_login(member)
    panel = client.get(f"/console/jobs/{job['id']}/explain").content.decode()
    assert window in panel
    form = {"tenant": "vision", "pool": "windows", "name": "p", "image": TEST_IMAGE_TAG}
    form |= {"shape_mode": "inline", "cpu_millicores_min": "1000", "memory_mib_min": "1024"}
    preview = client.post("/console/jobs/new/preview", form)
    assert preview.status_code == 200 and window in preview.content.decode()
    page = client.get(f"/console/jobs/{job['id']}").content.decode()
    for html in (panel, preview.content.decode(), page):
        assert_untold(html, theirs.expires_at)


def test_the_forecast_snaps_to_the_coarse_windows(wpool, wnode, tenant, other_tenant):
    theirs = hold(wpool, other_tenant, 17)
    job = Job.objects.create(
        tenant=tenant,
        pool=wpool,
        name="waits",
        image=TEST_IMAGE_TAG,
        resources=cpu_request(cpu=1000, memory=1024),
    )
    now = timezone.now()
    forecast.refresh(wpool.pk, now)
    job.refresh_from_db()
    bounds = [job.forecast["earliest"], job.forecast["latest"]]
    assert all(bounds), job.forecast
    # the capacity comes free in 17 minutes: the window is "now to an hour from now"
    minute = now.replace(second=0, microsecond=0)
    assert bounds == [minute.isoformat(), (minute + timedelta(hours=1)).isoformat()]
    assert_untold(str(job.forecast), theirs.expires_at)


def test_the_requesters_own_lease_is_still_told_exactly(wpool, wnode, tenant, member):
    mine = hold(wpool, tenant, 17)
    refused = client_for(member).post(
        LEASES,
        {
            "pool": "windows",
            "tenant": "vision",
            "resources": {"cpu_millicores_min": 1000, "memory_mib_min": 1024},
            "duration_s": 60,
        },
        format="json",
    )
    near = refused.json()["nearest_miss"]
    assert near["fits_at"][:19] == mine.expires_at.isoformat()[:19]
    assert near["fits_within"] == "within the hour"
    assert re.search(rf"when lease {mine.pk} ends at .*{mine.expires_at:%H:%M}", near["message"])


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "within the hour"),
        (3599, "within the hour"),
        (3600, "in 1–4 hours"),
        (4 * 3600, "in 4–24 hours"),
        (86400, "in more than a day"),
    ],
)
def test_the_windows(seconds, words):
    assert coarse_window(seconds) == words
