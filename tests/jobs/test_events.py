"""Job transitions are published on commit at /ws/jobs/: the job's tenant and operators follow
them, another tenant does not; one job is followed where the job API shows it."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from config.builders import SYSTEM, submit_job
from jobs.services import job_cancel
from pools.consumers import NOTHING_TO_FOLLOW
from pools.reasons import Reason
from tests.live_events import followed, own_channel_layer, refused

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(pool, tenant):
    return submit_job(pool, tenant, "resnet")


def cancel(job):
    return job_cancel(job=job, actor=SYSTEM, message="changed my mind")


def test_a_job_transition_reaches_its_tenant_and_operators_not_another_tenant(
    job, member, operator, outsider
):
    async def scenario():
        sockets = [
            await followed(member, "/ws/jobs/"),
            await followed(operator, "/ws/jobs/"),
            await followed(member, f"/ws/jobs/{job.pk}/"),
        ]
        outsider_socket = await followed(outsider, "/ws/jobs/")
        await database_sync_to_async(cancel)(job)
        for socket in sockets:
            event = await socket.receive_json_from(timeout=5)
            assert (event["job"], event["name"], event["state"]) == (job.pk, "resnet", "cancelled")
            assert (event["from"], event["to"]) == ("queued", "cancelled")
            assert (event["reason"], event["message"]) == (
                Reason.CANCELLED_BY_USER,
                "changed my mind",
            )
        assert await outsider_socket.receive_nothing(timeout=0.5)
        for socket in [*sockets, outsider_socket]:
            await socket.disconnect()

    with own_channel_layer():
        async_to_sync(scenario)()


def test_following_one_job_needs_the_api_to_show_it(job, member, operator, outsider):
    async def scenario():
        assert await refused(member, f"/ws/jobs/{job.pk}/") is None
        assert await refused(operator, f"/ws/jobs/{job.pk}/") is None
        assert await refused(outsider, f"/ws/jobs/{job.pk}/") == NOTHING_TO_FOLLOW

    with own_channel_layer():
        async_to_sync(scenario)()
