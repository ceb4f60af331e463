"""Gangs of jobs (docs/scheduler.md "Gangs of jobs"): a tenant's queued jobs in a pool that
share a gang name, placed together or not at all. Both paths form them here, alike.

`form_gangs` is pure: members in job-id order make gangs of `size` (a name used again makes
the next gang); a gang with fewer than `size` members waits with `gang_incomplete`, one whose
members disagree on the gang or ask for different things waits with `gang_mismatch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from placement import Request
from pools import validation
from pools.reasons import Reason

from .outcomes import PassResult, scheduling_error


@dataclass(frozen=True, slots=True, eq=False)
class Gang:
    """A whole gang: `size` members in job-id order that ask alike. `replicas`: their request
    as the core places a gang (`size` replicas under the gang's topology). Each gang is its
    own (compared and hashed by identity)."""

    name: str
    topology: str
    members: tuple
    replicas: Request

    @property
    def tenant_id(self) -> int:
        return self.members[0].tenant_id


@dataclass(frozen=True, slots=True)
class GangWaits:
    """Members that form no whole gang, and why they wait (one explanation they share)."""

    members: tuple
    explanation: dict


def form_gangs(members: Sequence, core_requests: Mapping[int, Request]) -> list[Gang | GangWaits]:
    """`members` (jobs with `pk`, `tenant_id` and a well-formed `gang`) as whole gangs or
    waiting members, gangs in the order of their first members in `members`.
    `core_requests`: job id → its core Request."""
    groups: dict[tuple, list] = {}
    for job in members:
        groups.setdefault((job.tenant_id, job.gang["name"]), []).append(job)
    formed: list[Gang | GangWaits] = []
    for (_, name), group in groups.items():
        group.sort(key=lambda job: job.pk)
        if any(job.gang != group[0].gang for job in group):
            formed.append(GangWaits(tuple(group), _mismatch(name)))
            continue
        size, topology = group[0].gang["size"], group[0].gang["topology"]
        for start in range(0, len(group), size):
            gang = tuple(group[start : start + size])
            if len(gang) < size:
                message = f"{len(gang)} of {size} members queued"
                formed.append(
                    GangWaits(gang, {"code": Reason.GANG_INCOMPLETE.value, "message": message})
                )
                continue
            first = core_requests[gang[0].pk]
            if any(_alike(core_requests[job.pk]) != _alike(first) for job in gang):
                formed.append(GangWaits(gang, _mismatch(name)))
                continue
            formed.append(Gang(name, topology, gang, replace(first, replicas=size, gang=topology)))
    return formed


def _mismatch(name: str) -> dict:
    message = f"the members of gang {name} ask for different resources, size or topology"
    return {"code": Reason.GANG_MISMATCH.value, "message": message}


def _alike(core_request: Request) -> Request:
    # members may differ in their own labels (a rank, a role), never in what they ask
    return replace(core_request, name="", labels=())


def well_formed(jobs: list, now, result: PassResult) -> list:
    """The jobs whose stored `gang` is well formed (as submit validates it); one that is not (a
    row edited behind the API's back) fails with `scheduling_error`, alone."""
    kept = []
    for job in jobs:
        try:
            job.gang = validation.job_gang(job.gang)
        except Exception as error:
            result.pending[job.pk] = scheduling_error(job.pk, error, now)
        else:
            kept.append(job)
    return kept
