"""The submit-to-running benchmark's measuring parts (issue 20, goal 1).

`manage.py bench_latency --rate R --jobs N` (config/management/commands) starts the stack and
calls these: `submit_open_loop` sends N submits through the public API on a fixed schedule
(R per minute, each on its own thread, so a slow answer never delays the next send);
`job_latencies` reads each job's own events back (submitted → leased → `container_started`);
`engine_floor` times the Docker engine doing the same container alone, in the same run.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass

import requests

from jobs.choices import TERMINAL, JobState
from jobs.models import Job, JobEvent
from pools.reasons import Reason

# What every job runs: a shell that exits at once, on the smallest request a node takes.
COMMAND = ["sh", "-c", "true"]
RESOURCES = {"cpu_millicores_min": 100, "memory_mib_min": 64}


def job_body(tenant: str, pool: str, image: str, name: str) -> dict:
    return {
        "tenant": tenant,
        "pool": pool,
        "name": name,
        "resources": RESOURCES,
        "image": image,
        "command": COMMAND,
        "network_policy": {"mode": "none"},
    }


@dataclass
class Sent:
    """One submit: when it was due and sent (seconds from the schedule's start), the answer."""

    index: int
    due_s: float
    sent_s: float = 0.0
    answer_s: float = 0.0
    status: int = 0
    job_id: int | None = None
    error: str = ""


def submit_open_loop(
    url: str, token: str, bodies: list[dict], rate_per_min: float, timeout_s: float = 60
) -> list[Sent]:
    """POST each body to `url` at its own time, i × 60 / rate seconds after the start (open
    loop: a send waits for its time only, never for an earlier answer). Returns every submit
    once all have been answered or have failed."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    interval = 60.0 / rate_per_min
    sent = [Sent(index=i, due_s=i * interval) for i in range(len(bodies))]

    def send(record: Sent, body: dict, start: float):
        record.sent_s = time.monotonic() - start
        try:
            answer = requests.post(url, json=body, headers=headers, timeout=timeout_s)
            record.status = answer.status_code
            if answer.status_code == 201:
                record.job_id = answer.json()["id"]
            else:
                record.error = answer.text[:300]
        except requests.RequestException as exc:
            record.error = f"{type(exc).__name__}: {exc}"[:300]
        record.answer_s = time.monotonic() - start - record.sent_s

    threads = []
    start = time.monotonic()
    for record, body in zip(sent, bodies, strict=True):
        delay = start + record.due_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=send, args=(record, body, start), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout_s + 5)
    return sent


def submit_summary(sent: list[Sent]) -> dict:
    """How the sends kept to their schedule and how the API answered."""
    accepted = [s for s in sent if s.job_id is not None]
    refused = [s for s in sent if s.job_id is None]
    return {
        "accepted": len(accepted),
        "refused": len(refused),
        "refusals": dict(Counter(s.status or s.error.split(":")[0] for s in refused)),
        "refusal_samples": [s.error for s in refused[:3]],
        "send_lag_max_s": round(max((s.sent_s - s.due_s for s in sent), default=0.0), 4),
        "answer_s": percentiles([s.answer_s for s in accepted]),
    }


def percentiles(values: list[float]) -> dict:
    """p50, p90, p99 (linear between the nearest ranks) and max, in seconds; n counted."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {
        "n": len(ordered),
        "p50": round(at(0.50), 4),
        "p90": round(at(0.90), 4),
        "p99": round(at(0.99), 4),
        "max": round(ordered[-1], 4),
    }


def unfinished(job_ids: list[int]) -> int:
    return Job.objects.filter(pk__in=job_ids).exclude(state__in=TERMINAL).count()


def wait_for_end(job_ids: list[int], timeout_s: float) -> bool:
    """True once every job has ended (succeeded, failed, cancelled, lost) within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not unfinished(job_ids):
            return True
        time.sleep(0.5)
    return not unfinished(job_ids)


# The spans reported, each between the first events of two marks (a job's own events only).
SPANS = {
    "submitted_to_leased": ("submitted", "leased"),
    "leased_to_running": ("leased", "running"),
    "submitted_to_running": ("submitted", "running"),
    # how long a job holds its capacity: with the node's room this bounds the rate it sustains
    "leased_to_ended": ("leased", "ended"),
}
# leased → running in the agent's steps, as the control plane received its reports: the agent
# finding its assignment (`image_pulling`), the image check (→ `startup_began`), and creating
# and starting the container (→ `container_started`), where the engine's own start lies.
STEPS = {
    "leased_to_pulling": ("leased", "pulling"),
    "pulling_to_starting": ("pulling", "starting"),
    "starting_to_running": ("starting", "running"),
}


def _mark(reason: str, to_state: str) -> str:
    if reason == Reason.SUBMITTED:
        return "submitted"
    if to_state == JobState.LEASED and reason not in (Reason.IMAGE_PULLING, Reason.IMAGE_PULLED):
        return "leased"
    if reason in (Reason.IMAGE_PULLING, Reason.IMAGE_PULLED):
        return "pulling"
    if reason == Reason.STARTUP_BEGAN:
        return "starting"
    if reason == Reason.CONTAINER_STARTED:
        return "running"
    if to_state in TERMINAL:
        return "ended"
    return ""


def job_latencies(job_ids: list[int]) -> dict:
    """From the jobs' own events (their first of each mark): submitted → leased (the event into
    `leased`), leased → running (`container_started`), submitted → running and leased → ended,
    and leased → running in the agent's steps (p50 only), in seconds; the final states' counts."""
    first: dict[int, dict[str, float]] = {}
    events = JobEvent.objects.filter(job_id__in=job_ids).order_by("at", "id")
    for job_id, reason, to_state, at in events.values_list("job_id", "reason", "to_state", "at"):
        mark = _mark(reason, to_state)
        if mark:
            first.setdefault(job_id, {}).setdefault(mark, at.timestamp())

    def spans(since: str, until: str) -> list[float]:
        return [m[until] - m[since] for m in first.values() if since in m and until in m]

    states = Counter(Job.objects.filter(pk__in=job_ids).values_list("state", flat=True))
    return {name: percentiles(spans(*marks)) for name, marks in SPANS.items()} | {
        "leased_to_running_steps_p50": {
            name: percentiles(spans(*marks))["p50"] for name, marks in STEPS.items()
        },
        "states": dict(sorted(states.items())),
    }


def engine_floor(image: str, runs: int = 5) -> dict:
    """The engine's own cost of the jobs' container, nothing of ours: `docker run --rm
    --network none IMAGE sh -c true` timed `runs` times (the CLI: one client process, one
    round of create, attach, start, wait, remove), and the same split into its calls through
    the Docker SDK (create, start, wait, remove). Medians, in seconds."""
    import docker

    cli = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, *COMMAND],
            check=True,
            capture_output=True,
            timeout=60,
        )
        cli.append(time.perf_counter() - started)
    steps: dict[str, list[float]] = {"create": [], "start": [], "wait": [], "remove": []}
    client = docker.from_env(timeout=60)
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            container = client.containers.create(image, COMMAND, network_mode="none")
            t1 = time.perf_counter()
            container.start()
            t2 = time.perf_counter()
            container.wait(timeout=60)
            t3 = time.perf_counter()
            container.remove(force=True)
            t4 = time.perf_counter()
            for name, span in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name].append(span)
    finally:
        client.close()
    sdk = {f"{name}_s": round(statistics.median(values), 4) for name, values in steps.items()}
    sdk["total_s"] = round(sum(sdk.values()), 4)
    return {
        "command": f"docker run --rm --network none {image} {' '.join(COMMAND)}",
        "runs": runs,
        "docker_run_s": {
            "median": round(statistics.median(cli), 4),
            "min": round(min(cli), 4),
            "max": round(max(cli), 4),
        },
        "sdk_median": sdk,
    }
