"""The lease admin moved with the models: its pages load under the app's new label."""

from datetime import timedelta

from django.utils import timezone

from config.builders import SYSTEM, cpu_request
from leases import services


def test_lease_admin_pages_load(admin_client, lpool, ltenant, lnode):
    lease = services.lease_reserve(
        pool=lpool,
        tenant=ltenant,
        request=cpu_request(),
        actor=SYSTEM,
        duration=timedelta(minutes=5),
        now=timezone.now(),
    )
    for url in (
        "/admin/leases/lease/",
        f"/admin/leases/lease/{lease.pk}/change/",
        "/admin/leases/leaseevent/",
    ):
        assert admin_client.get(url).status_code == 200, url
