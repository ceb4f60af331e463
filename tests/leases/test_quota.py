"""Quotas over every dimension: each refusal names its dimension; a GPU counts by its real share
(seven 1g.10gb MIG slices or four 0.25 time-slices make one GPU); GPU-hours and egress per
period; the jobs' stored outputs; the scheduler's views (tenants_at_quota, Headroom)."""

import io
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from config.builders import SYSTEM, build_node, cpu_request, gpu_request, submit_job
from jobs import artifacts
from jobs.models import JobOutput
from leases import services
from leases.models import gpu_share
from leases.selectors import ledger_problems
from leases.services import quota
from leases.services.usage import leases_record_usage
from pools.models import Quota
from pools.reasons import Reason
from pools.statemachine import TransitionRefused

HOUR = timedelta(hours=1)
MIB = 1024 * 1024


def reserve(pool, tenant, request=None, **kw):
    kw.setdefault("duration", HOUR)
    return services.lease_reserve(
        pool=pool, tenant=tenant, request=request or cpu_request(), actor=SYSTEM, **kw
    )


def refused(pool, tenant, request=None, **kw) -> TransitionRefused:
    with pytest.raises(TransitionRefused) as caught:
        reserve(pool, tenant, request, **kw)
    return caught.value


def set_quota(tenant, pool, **limits):
    fields = {"cpu_millicores": 10**6, "memory_mib": 10**7, "gpus": 100, **limits}
    return Quota.objects.update_or_create(tenant=tenant, pool=pool, defaults=fields)[0]


def test_gpu_share_counts_a_gpu_by_its_real_share():
    assert gpu_share([{"milli": 1000, "mig_slots": 0}] * 2) == 2
    assert gpu_share([{"milli": 250, "mig_slots": 0}]) == 0.25
    assert gpu_share([{"milli": 0, "mig_slots": 1, "mig_profile": "1g.10gb"}]) == 1 / 7
    assert gpu_share([{"milli": 0, "mig_slots": 15, "mig_profile": "3g.40gb"}]) == 3 / 7
    assert gpu_share([{"milli": 0, "mig_slots": 255, "mig_profile": "7g.80gb"}]) == 1
    assert gpu_share([{"milli": 0, "mig_slots": 0b11}]) == 2 / 7  # no profile: its slices
    assert gpu_share([]) == 0


def test_seven_1g_slices_are_one_gpu_of_quota(lpool, ltenant):
    build_node(lpool, "mig", cpu=64000, memory=131072, gpus=[{"mig_enabled": True}] * 2)
    set_quota(ltenant, lpool, gpus=1)
    slices = []
    for _ in range(7):
        slices.append(reserve(lpool, ltenant, gpu_request("mig", 1, mig_profile="1g.10gb")))
    refusal = refused(lpool, ltenant, gpu_request("mig", 1, mig_profile="1g.10gb"))
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", "gpus")
    assert refusal.body()["dimension"] == "gpus" and "gpus 1.14" in refusal.message
    # the capacity was there (a second device); CPU work still fits the quota
    reserve(lpool, ltenant, cpu_request())
    services.lease_release(lease=slices[0], actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT)
    reserve(lpool, ltenant, gpu_request("mig", 1, mig_profile="1g.10gb"))
    assert ledger_problems(lpool) == []


def test_four_quarter_time_slices_are_one_gpu_of_quota(lpool, ltenant):
    build_node(lpool, "ts", cpu=64000, memory=131072, gpus=[{"sharing_mode": "timeslice"}] * 2)
    set_quota(ltenant, lpool, gpus=1)
    for _ in range(4):
        reserve(lpool, ltenant, gpu_request("timeslice", 1, 250))
    refusal = refused(lpool, ltenant, gpu_request("timeslice", 1, 250))
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", "gpus")


@pytest.mark.parametrize(
    "limits, dimension",
    [
        ({"max_leases": 1}, "leases"),
        ({"cpu_millicores": 1500}, "cpu_millicores"),
        ({"memory_mib": 1500}, "memory_mib"),
    ],
)
def test_each_held_dimension_refuses_with_its_name(lpool, ltenant, lnode, limits, dimension):
    set_quota(ltenant, lpool, **limits)
    reserve(lpool, ltenant, cpu_request(1000, 1024))
    refusal = refused(lpool, ltenant, cpu_request(1000, 1024))
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", dimension)
    assert quota.explanation(refusal)["dimension"] == dimension


def test_gpu_hours_are_counted_over_the_current_period(lpool, ltenant):
    build_node(lpool, "g", cpu=64000, memory=131072, gpus=[{}, {}])
    set_quota(ltenant, lpool, gpu_hours_per_period=4.5, period_days=30)
    start, end = quota.quota_period(30, timezone.now())
    assert end - start == timedelta(days=30) and start <= timezone.now() < end
    now = start + 3 * HOUR
    # before the period: not counted (4 of the previous period's 4.5); across its start: the
    # hour inside counts
    before = reserve(lpool, ltenant, gpu_request(), now=start - 5 * HOUR)
    services.lease_release(
        lease=before, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=start - HOUR
    )
    across = reserve(lpool, ltenant, gpu_request(), now=start - HOUR)
    services.lease_release(
        lease=across, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=start + HOUR
    )
    # still holding: two GPUs, two hours so far at now
    holding = reserve(lpool, ltenant, gpu_request(count=2), now=start + HOUR)
    used = quota.usage({(ltenant.pk, lpool.pk): Quota.objects.get()}, now)
    assert used[(ltenant.pk, lpool.pk)]["gpu_hours"] == pytest.approx(5.0)
    services.lease_release(lease=holding, actor=SYSTEM, reason=Reason.RELEASED_BY_CLIENT, now=now)
    refusal = refused(lpool, ltenant, gpu_request(), now=now)
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", "gpu_hours")
    reserve(lpool, ltenant, cpu_request(), now=now)  # GPU-hours limit only GPU work
    # the next period starts afresh
    reserve(lpool, ltenant, gpu_request(), now=end + HOUR)


def test_egress_per_period_refuses_new_work_once_used_up(lpool, ltenant, lnode):
    set_quota(ltenant, lpool, egress_mib=10)
    lease = reserve(lpool, ltenant)
    lease = services.lease_commit(lease=lease, fencing_token=lease.fencing_token, actor=SYSTEM)
    for sent in (4 * MIB, 11 * MIB, 9 * MIB):  # a counter: a lower sample never lowers it
        leases_record_usage(node=lnode, workloads=[{"lease": lease.pk, "usage": _usage(sent)}])
    lease.refresh_from_db()
    assert lease.usage_peak["net_tx_bytes"] == 11 * MIB
    assert "net_tx_bytes" not in lease.usage_average
    refusal = refused(lpool, ltenant)
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", "egress_mib")
    blocked = services.tenants_at_quota(pool_id=lpool.pk)
    assert blocked[(ltenant.pk, lpool.pk)]["dimension"] == "egress_mib"


def _usage(sent: int) -> dict:
    return {"cpu_millicores": 10, "memory_mib": 10, "net_tx_bytes": sent}


def test_storage_refuses_an_upload_past_it_and_then_new_work(
    lpool, ltenant, lnode, settings, tmp_path
):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    set_quota(ltenant, lpool, storage_mib=1)
    job = submit_job(lpool, ltenant, output_limit_mib=1)  # no more than the quota's room
    half = b"x" * (600 * 1024)
    artifacts.job_output_store(job=job, attempt=1, name="a.bin", fileobj=io.BytesIO(half))
    with pytest.raises(quota.QuotaRefused) as caught:
        artifacts.job_output_store(job=job, attempt=1, name="b.bin", fileobj=io.BytesIO(half))
    assert caught.value.dimension == "storage_mib" and caught.value.status == 409
    assert list(JobOutput.objects.values_list("name", flat=True)) == ["a.bin"]
    # b.bin's partial file is deleted (stored files are named by random keys, not by the name)
    assert len([p for p in (tmp_path / "media").rglob("*") if p.is_file()]) == 1
    # replacing an output frees its old size first
    artifacts.job_output_store(job=job, attempt=1, name="a.bin", fileobj=io.BytesIO(half))
    assert services.tenants_at_quota(pool_id=lpool.pk) == {}
    Quota.objects.filter(tenant=ltenant).update(storage_mib=0)
    blocked = services.tenants_at_quota(pool_id=lpool.pk)
    assert blocked[(ltenant.pk, lpool.pk)]["dimension"] == "storage_mib"


def test_an_output_limit_above_the_storage_left_is_refused_at_submit(
    lpool, ltenant, lnode, settings, tmp_path
):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    set_quota(ltenant, lpool, storage_mib=3)
    job = submit_job(lpool, ltenant, output_limit_mib=3)
    assert job.output_limit_mib == 3 and job.resources["output_limit_mib"] == 3
    artifacts.job_output_store(job=job, attempt=1, name="a.bin", fileobj=io.BytesIO(b"x" * MIB))
    with pytest.raises(ValidationError) as caught:
        submit_job(lpool, ltenant, output_limit_mib=3)  # 2 MiB left
    assert "output_limit_mib" in caught.value.message_dict
    assert submit_job(lpool, ltenant, output_limit_mib=2).output_limit_mib == 2
    with pytest.raises(ValidationError):
        submit_job(lpool, ltenant)  # the default (1024 MiB) does not fit either


def test_headroom_names_the_dimension_and_counts_shares(lpool, ltenant, ltenant2, lnode):
    set_quota(ltenant, lpool, gpus=1)
    reserve(lpool, ltenant)
    rooms = quota.quota_headroom(lpool.pk, [ltenant.pk, ltenant2.pk])
    assert set(rooms) == {ltenant.pk}  # no quota, no account: unlimited
    room = rooms[ltenant.pk]
    quarter = gpu_share([{"milli": 250, "mig_slots": 0}])
    for _ in range(4):
        assert room.take(cpu_millicores=1, memory_mib=1, gpus=quarter) == ""
    message = room.take(cpu_millicores=1, memory_mib=1, gpus=quarter)
    assert message == "Quota exceeded: gpus 1.25 > 1"
    assert room.explanation(message) == {
        "code": "quota_exceeded",
        "dimension": "gpus",
        "message": message,
    }
    assert room.take(cpu_millicores=1, memory_mib=1, gpus=0) == ""  # nothing was deducted


def _reservation(pool, tenant, now):
    """A reservation of the whole of lnode (4 cores) an hour ahead: backfill may run in it."""
    window = services.Window(now + 4 * HOUR, now + 5 * HOUR, timedelta(minutes=5))
    return reserve(pool, tenant, cpu_request(4000, 8192), window=window, now=now)


def test_a_backfill_counts_against_its_own_tenants_quota(lpool, ltenant, ltenant2, lnode):
    """An abuse test found 12 backfill leases against a quota of 2: backfill went round the
    quota check. It is the backfilling tenant's work, so its quota counts it."""
    now = timezone.now()
    held = _reservation(lpool, ltenant, now)
    set_quota(ltenant2, lpool, max_leases=2)
    first = reserve(lpool, ltenant2, cpu_request(500, 512), now=now)
    second = reserve(lpool, ltenant2, cpu_request(500, 512), now=now)
    assert first.backfill_of_id == second.backfill_of_id == held.pk
    refusal = refused(lpool, ltenant2, cpu_request(500, 512), now=now)
    assert (refusal.code, refusal.dimension) == ("quota_exceeded", "leases")
    used = quota.usage({(ltenant2.pk, lpool.pk): None}, now)[(ltenant2.pk, lpool.pk)]
    assert used["leases"] == 2 and used["cpu_millicores"] == 1000  # what the quota page shows
    assert ledger_problems(lpool) == []
