"""The pass's Admission: one object owns the queue's gate, each tenant's quota headroom and the
refusals; `trial()` takes back what an all-or-none gang admitted when it is not committed."""

from types import SimpleNamespace

from leases.services.quota import Headroom
from placement.queue import BACKFILL_WOULD_DELAY_HEAD, Gate, QueuedJob
from pools.models import Quota
from scheduling.pass_steps.admission import GATE_MESSAGES, Admission


def job(pk: int, tenant: int = 1, cpu: int = 1000):
    return SimpleNamespace(pk=pk, tenant_id=tenant, resources={"cpu_millicores_min": cpu})


def placement(cpu: int = 1000):
    return SimpleNamespace(cpu_millicores=cpu, memory_mib=512)


def admission(jobs, *, quota_cpu: int = 2500) -> Admission:
    demand = {j.pk: (j.resources["cpu_millicores_min"], 512, 0) for j in jobs}
    queued = {j.pk: QueuedJob(j.pk, j.tenant_id, demand=demand[j.pk]) for j in jobs}
    headroom = {1: Headroom(Quota(cpu_millicores=quota_cpu, memory_mib=10**6), {})}
    gate = Gate((4000.0, 8192.0, 0.0), (0.0, 0.0, 0.0))
    return Admission(headroom, gate=gate, queued=queued)


def test_admit_takes_from_the_gate_and_the_headroom_or_names_the_refusal():
    jobs = [job(1), job(2), job(3), job(4, tenant=2, cpu=2000)]
    a = admission(jobs)
    assert a.admit(jobs[0], placement()) is None and a.admit(jobs[1], placement()) is None
    refusal = a.admit(jobs[2], placement())  # 3,000 millicores > the quota's 2,500
    assert refusal["code"] == "quota_exceeded" and refusal["dimension"] == "cpu_millicores"
    assert a.refusals == {3: refusal}
    assert a.gate.used[0] == 2000  # the refused job took nothing
    assert a.admit(jobs[3], placement(2000)) is None  # tenant 2 has no quota
    assert a.gate.used[0] == 4000


def test_a_blocked_job_holds_its_capacity_at_the_gate():
    jobs = [job(1, cpu=3000), job(2, tenant=2, cpu=2000)]
    a = admission(jobs, quota_cpu=10**6)
    a.gate.used[0] = 2000  # held by running work
    a.blocked(jobs[0], SimpleNamespace(nearest_miss=None))  # waits, start unknown
    refusal = a.admit(jobs[1], placement(2000))
    # another tenant's head, its start unknown: neither named nor timed, and no runtime advice
    assert refusal == {
        "code": BACKFILL_WOULD_DELAY_HEAD,
        "message": GATE_MESSAGES[BACKFILL_WOULD_DELAY_HEAD].format(ahead="a job of another tenant"),
        "advice": "wait: it runs once the job ahead of it has started",
    }


def test_the_tenants_own_head_is_named_and_its_start_bounds_the_advice():
    jobs = [job(1, cpu=3000), job(2, cpu=2000)]  # one tenant
    a = admission(jobs, quota_cpu=10**6)
    a.gate.used[0] = 2000
    a.gate.blocked(a.queued[1], 600.0)  # the head could start in 10 minutes
    refusal = a.admit(jobs[1], placement(2000))
    assert refusal["blocker_job"] == 1 and "your job 1" in refusal["message"]
    assert refusal["advice"].startswith("declare a maximum runtime under 600 s")


def test_another_tenants_head_start_is_told_only_as_its_coarse_window_floor():
    jobs = [job(1, cpu=3000), job(2, tenant=2, cpu=2000)]
    a = admission(jobs, quota_cpu=10**6)
    a.gate.used[0] = 2000
    a.gate.blocked(a.queued[1], 2 * 3600 + 17.0)  # in 1–4 hours
    refusal = a.admit(jobs[1], placement(2000))
    assert "blocker_job" not in refusal and "7217" not in str(refusal)
    assert refusal["advice"].startswith("declare a maximum runtime under 3600 s")


def test_a_trial_not_committed_takes_back_the_gate_and_the_headroom():
    jobs = [job(1), job(2), job(3), job(4)]
    a = admission(jobs)
    assert a.admit_all(jobs[:2], [placement(), placement()]) is None  # committed
    assert a.gate.used[0] == 2000 and a.headroom[1].used["cpu_millicores"] == 2000
    with a.trial():
        assert a.admit(jobs[2], placement(500)) is None
        assert a.headroom[1].used["cpu_millicores"] == 2500
    assert a.gate.used[0] == 2000 and a.headroom[1].used["cpu_millicores"] == 2000
    refusal = a.admit_all(jobs[2:], [placement(500), placement(500)])
    assert refusal["code"] == "quota_exceeded"  # the second is over: neither keeps anything
    assert a.gate.used[0] == 2000 and a.headroom[1].used["cpu_millicores"] == 2000


def test_without_a_gate_only_the_headroom_admits():
    jobs = [job(1, cpu=2000), job(2, cpu=2000)]
    a = Admission({1: Headroom(Quota(cpu_millicores=3000, memory_mib=10**6), {})})
    assert a.admit(jobs[0], placement(2000)) is None
    assert a.admit(jobs[1], placement(2000))["code"] == "quota_exceeded"
    a.blocked(jobs[1], SimpleNamespace(nearest_miss=None))  # no gate: nothing to hold
