"""The commands: each takes the client and the parsed arguments, prints, and returns the exit
code (0, or 4 for `watch` when the job did not succeed). Refusals and server trouble are
raised (poolctl.client) and turned into exit codes by poolctl.cli."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from pathlib import Path
from urllib.parse import quote

from poolctl import manifest, output
from poolctl.client import Client, ServerError
from poolctl.config import UsageError

TERMINAL = {"succeeded", "failed", "cancelled", "lost"}  # jobs/choices.py TERMINAL
WATCH_FAILED = 4
LOG_WINDOW = 10_000  # the most lines GET /jobs/{id}/logs?tail= returns

JOB_COLUMNS = [
    ("ID", "id"),
    ("NAME", "name"),
    ("TENANT", "tenant"),
    ("POOL", "pool"),
    ("STATE", "state"),
    ("EXIT", "exit_code"),
    ("CREATED", "created_at"),
]
JOB_DETAILS = [
    "id", "name", "tenant", "pool", "state", "state_changed_at", "shape", "resources",
    "gpu_isolation", "image", "command", "priority_class", "attempts", "exit_code", "route",
    "created_at", "pending_reason",
]  # fmt: skip
LEASE_COLUMNS = [
    ("ID", "id"),
    ("POOL", "pool"),
    ("TENANT", "tenant"),
    ("NODE", "node"),
    ("STATE", "state"),
    ("CPU(m)", "cpu_millicores"),
    ("MEM(MiB)", "memory_mib"),
    ("GPU(milli)", "held.gpu_milli"),
    ("JOB", "job"),
    ("EXPIRES", "expires_at"),
    ("FENCING", "fencing_token"),
]
LEASE_DETAILS = [
    "id", "pool", "tenant", "node", "state", "fencing_token", "expires_at", "committed_at",
    "ended_at", "job", "window_start", "window_end", "tolerance_s", "backfill_of", "jobs", "held",
    "gpu_allocations", "request", "created_at",
]  # fmt: skip
SHAPE_COLUMNS = [
    ("POOL", "pool"),
    ("NAME", "name"),
    ("CPU(m)", "cpu_millicores_min"),
    ("MEM(MiB)", "memory_mib_min"),
    ("GPUS", "gpu_count"),
    ("SHARING", "gpu_sharing_class"),
    ("GPU(milli)", "gpu_milli"),
    ("MIG", "mig_profile"),
    ("DESCRIPTION", "description"),
]
QUOTA_COLUMNS = [
    ("DIMENSION", "dimension"),
    ("USED", "used"),
    ("LIMIT", lambda row: "unlimited" if row["limit"] is None else row["limit"]),
]
VOLUME_COLUMNS = [
    ("ID", "id"),
    ("NAME", "name"),
    ("TENANT", "tenant"),
    ("POOL", "pool"),
    ("NODE", "node"),
    ("SIZE(MiB)", "size_mib"),
    ("STATE", "state"),
    ("AT RISK", lambda row: row.get("at_risk_reason") or ""),
]
EVENT_COLUMNS = [
    ("AT", "at"),
    ("FROM", "from_state"),
    ("TO", "to_state"),
    ("REASON", "reason"),
    ("ACTOR", "actor"),
    ("MESSAGE", "message"),
]


def job_view(job: dict) -> dict:
    """A job for people: its command as a shell would read it."""
    command = job.get("command")
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        return {**job, "command": shlex.join(command)}
    return job


def show(args, data, columns=None, keys=None) -> int:
    """--json: the API's JSON as it came; otherwise a table (lists) or details (objects)."""
    if args.json:
        output.as_json(data)
    elif isinstance(data, list):
        output.table(data, columns)
    else:
        output.details(data, [key for key in keys if key in data] if keys else None)
    return 0


def default_tenant(client: Client, given: str | None) -> str:
    """--tenant, else the configured one, else the caller's only tenant (GET /me)."""
    if given or client.config.tenant:
        return given or client.config.tenant
    tenants = [t["slug"] for t in client.get("me").get("tenants", [])]
    if len(tenants) != 1:
        choices = ", ".join(tenants) or "none"
        raise UsageError(f"give --tenant (or POOLCTL_TENANT); your tenants: {choices}")
    return tenants[0]


# --- jobs ------------------------------------------------------------------------------------


def submit(client: Client, args) -> int:
    body = manifest.read(args.file) if args.file else {}
    body = manifest.merge(body, args)
    body["pool"] = body.get("pool") or client.config.pool
    missing = [field for field in ("pool", "name", "image") if not body.get(field)]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}: give them as flags or in a manifest")
    body["tenant"] = default_tenant(client, body.get("tenant"))
    # a caller's own trace (OpenTelemetry's TRACEPARENT environment carrier): the job joins it
    traceparent = os.environ.get("TRACEPARENT", "").strip()
    job = client.post("jobs", body, headers={"traceparent": traceparent} if traceparent else None)
    if args.quiet:
        print(job["id"])
        return 0
    return show(args, job if args.json else job_view(job), keys=JOB_DETAILS)


def jobs(client: Client, args) -> int:
    if args.job is not None:
        job = client.get(f"jobs/{args.job}")
        return show(args, job if args.json else job_view(job), keys=JOB_DETAILS)
    states = [state for state in (args.state or "").split(",") if state]
    filters = {"pool__slug": args.pool, "tenant__slug": args.tenant}
    if len(states) == 1:
        filters["state"] = states[0]
    elif states:
        filters["state__in"] = ",".join(states)
    return show(args, client.list("jobs", limit=args.limit, **filters), JOB_COLUMNS)


def cancel(client: Client, args) -> int:
    job = client.post(f"jobs/{args.job}/cancel")
    if args.json:
        return show(args, job)
    print(f"job {job['id']} {job['state']}")
    return 0


def events(client: Client, args) -> int:
    return show(args, client.list(f"jobs/{args.job}/events"), EVENT_COLUMNS)


def explain(client: Client, args) -> int:
    """Why the job waits, or why it runs where it does (GET /jobs/{id}/explain): the reason
    from the last scheduling pass, what the scheduler says now, or the placement record."""
    answer = client.get(f"jobs/{args.job}/explain")
    if args.json or not isinstance(answer, dict):
        return show(args, answer)
    print(f"job {answer.get('job', args.job)}: {answer.get('state', '?')}")
    pending = answer.get("pending_reason")
    if isinstance(pending, dict) and pending:
        print(f"last pass: {pending.get('message') or output.cell(pending)}")
    now = answer.get("now")
    if isinstance(now, dict):
        if now.get("fits_now"):
            print(f"now: fits on {now.get('node')} (score {output.cell(now.get('score'))}, "
                  f"policy version {output.cell(now.get('policy_version'))})")  # fmt: skip
        else:
            never = " and never will (no node of the pool could ever hold it)"
            print(f"now: does not fit{never if now.get('never_fits') else ''}")
            if now.get("message"):
                print(f"  {now['message']}")
        shown = ("fits_now", "never_fits", "message")
        shown += ("node", "score", "policy_version") if now.get("fits_now") else ()
        rest = {k: v for k, v in now.items() if k not in shown}
        _indented(rest)
    placement = answer.get("placement")
    if isinstance(placement, dict):
        print(f"placed: lease {placement.get('lease')} on {placement.get('node')}")
        _indented({k: v for k, v in placement.items() if k not in ("lease", "node")})
    elif "placement" in answer:
        print("placed: no lease yet")
    return 0


def _indented(values: dict) -> None:
    for key, value in values.items():
        if value not in (None, "", [], {}):
            print(f"  {key}: {output.cell(value)}")


def _event_line(event: dict) -> str:
    change = event.get("to_state") or ""
    if event.get("from_state") and event.get("from_state") != change:
        change = f"{event['from_state']} -> {change}"
    parts = [output.cell(event.get("at")), change, event.get("reason") or "", event.get("message")]
    return "  ".join(part for part in parts if part)


def watch(client: Client, args) -> int:
    """Follows the job's events until it ends: 0 when it succeeded, 4 otherwise.

    It polls GET /jobs/{id} and /jobs/{id}/events?after=<the last event id seen> (the events'
    cursor): the live websocket (/ws/jobs/<id>/) takes a signed-in browser session, not an
    API token."""
    after = 0
    while True:
        job = client.get(f"jobs/{args.job}")  # the state first: its events are then all in
        for event in client.list(f"jobs/{args.job}/events", after=after):
            after = max(after, event["id"])
            if args.json:
                output.json_line(event)
            else:
                print(_event_line(event), flush=True)
        if job["state"] in TERMINAL:
            if not args.json:
                exit_code = "" if job.get("exit_code") is None else f" (exit {job['exit_code']})"
                print(f"job {job['id']} {job['state']}{exit_code}")
            return 0 if job["state"] == "succeeded" else WATCH_FAILED
        time.sleep(args.interval)


def _log(client: Client, job, tail: int) -> str:
    return client.request("GET", f"jobs/{job}/logs", params={"tail": tail}).text


def unseen(printed: list[str], text: str) -> tuple[list[str], bool]:
    """The lines of `text` (a tail of the log) after the lines already `printed` (the end of
    the same log): the longest end of `printed` that starts `text` is skipped. Second: False
    when no overlap was found although lines were printed (more new lines than one tail
    holds came since the last poll)."""
    lines = text.splitlines(keepends=True)
    if not printed:
        return lines, True
    last = printed[-1]
    for end in range(min(len(lines), len(printed)), 0, -1):  # the longest overlap first
        if lines[end - 1] == last and lines[:end] == printed[-end:]:
            return lines[end:], True
    return lines, False


def logs(client: Client, args) -> int:
    if not args.follow:
        sys.stdout.write(_log(client, args.job, args.tail))
        return 0
    printed: list[str] = []
    ended_polls = 0
    while True:
        state = client.get(f"jobs/{args.job}")["state"]
        new, joined = unseen(printed, _log(client, args.job, LOG_WINDOW))
        if not joined:
            print("poolctl: [some log lines came and went between two polls]", file=sys.stderr)
        ended_polls = ended_polls + 1 if state in TERMINAL else 0
        if new and not new[-1].endswith("\n") and ended_polls < 2:
            new = new[:-1]  # a line still being written: printed once it is whole
        sys.stdout.write("".join(new))
        sys.stdout.flush()
        printed = (printed + new)[-LOG_WINDOW:]
        if ended_polls >= 2:  # one more poll after the end: the agent's last upload
            return 0
        time.sleep(args.interval)


def outputs(client: Client, args) -> int:
    if not args.get:
        listing = client.get(f"jobs/{args.job}/outputs")
        columns = [("NAME", "name"), ("SIZE", "size"), ("ATTEMPT", "attempt"),
                   ("SHA256", "sha256"), ("CREATED", "created_at")]  # fmt: skip
        return show(args, listing, columns)
    return download(client, args)


def download(client: Client, args) -> int:
    """One output file to --output (default: its name here; "-": standard output), checked
    against the sha256 the server sends; a file is written to PATH.part, renamed when whole."""
    target = args.output or Path(args.get).name
    if target != "-" and os.path.exists(target) and not args.force:
        raise UsageError(f"{target} exists; give --force to replace it or --output PATH")
    path = f"jobs/{args.job}/outputs/{quote(args.get, safe='')}"
    response = client.request("GET", path, stream=True)
    expected = response.headers.get("X-Checksum-Sha256", "")
    if target == "-":
        digest, size = _copy(response, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        partial = f"{target}.part"
        try:
            with open(partial, "wb") as sink:
                digest, size = _copy(response, sink)
            if expected and expected != digest:
                raise ServerError(f"{args.get}: sha256 {digest}, the server said {expected}")
        except BaseException:
            os.unlink(partial)
            raise
        os.replace(partial, target)
        print(f"{target}: {size} bytes, sha256 {digest}", file=sys.stderr)
    if expected and expected != digest:  # standard output: said after the fact
        raise ServerError(f"{args.get}: sha256 {digest}, the server said {expected}")
    return 0


def _copy(response, sink) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in response.iter_content(64 * 1024):
        digest.update(chunk)
        size += len(chunk)
        sink.write(chunk)
    return digest.hexdigest(), size


# --- pools, shapes, quotas -------------------------------------------------------------------


def pools(client: Client, args) -> int:
    columns = [("ID", "id"), ("SLUG", "slug"), ("NAME", "name"), ("TRUST", "trust_level")]
    return show(args, client.list("compute-pools"), columns)


def shapes(client: Client, args) -> int:
    if args.pool:
        return show(args, client.get(f"compute-pools/{args.pool}/shapes"), SHAPE_COLUMNS)
    return show(args, client.list("shapes"), SHAPE_COLUMNS)


def quota(client: Client, args) -> int:
    """Your tenants' quotas per pool: each dimension's use and limit, and the credit balance
    (GET /quotas/)."""
    wanted = {"tenant": args.tenant, "pool": args.pool}  # narrowed here: the API lists all
    rows = [
        row
        for row in client.list("quotas")
        if all(not want or row.get(key) == want for key, want in wanted.items())
    ]
    if args.json:
        return show(args, rows)
    if not rows:
        print("(no quotas: nothing limits your tenants)")
    for index, row in enumerate(rows):
        if index:
            print()
        dimensions = row.get("dimensions")
        if not isinstance(dimensions, dict):  # a shape this version does not know
            print(output.cell(row))
            continue
        balance = row.get("balance")
        credit = "no credit limit" if balance is None else f"credit balance {balance}"
        start, end = output.cell(row.get("period_start")), output.cell(row.get("period_end"))
        print(f"{row.get('tenant')} in {row.get('pool')}: {credit}; period {start} to {end}")
        used = [
            {"dimension": name, "used": value.get("used"), "limit": value.get("limit")}
            for name, value in dimensions.items()
            if isinstance(value, dict)
        ]
        output.table(used, QUOTA_COLUMNS)
    return 0


# --- leases ----------------------------------------------------------------------------------


def leases(client: Client, args) -> int:
    filters = {"state": args.state, "pool__slug": args.pool, "tenant__slug": args.tenant}
    return show(args, client.list("compute-leases", limit=args.limit, **filters), LEASE_COLUMNS)


def lease_show(client: Client, args) -> int:
    return show(args, client.get(f"compute-leases/{args.lease}"), keys=LEASE_DETAILS)


def lease_reserve(client: Client, args) -> int:
    body = {
        "pool": args.pool or client.config.pool,
        "tenant": default_tenant(client, args.tenant),
    }
    if not body["pool"]:
        raise UsageError("give --pool (or POOLCTL_POOL)")
    resources = manifest.resources_from(args)
    if args.shape:
        body["shape"] = args.shape
    elif resources:
        body["resources"] = resources
    if args.duration is not None:
        body["duration_s"] = args.duration
    if args.start or args.end:  # a reservation: the server checks the window
        body["window"] = {"start": args.start, "end": args.end}
        if args.tolerance is not None:
            body["window"]["tolerance_s"] = args.tolerance
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    lease = client.post("compute-leases", body, headers=headers)
    return show(args, lease, keys=LEASE_DETAILS)


def lease_commit(client: Client, args) -> int:
    lease = client.post(f"compute-leases/{args.lease}/commit", {"fencing_token": args.fencing})
    return show(args, lease, keys=LEASE_DETAILS)


def lease_renew(client: Client, args) -> int:
    body = {"fencing_token": args.fencing}
    if args.duration is not None:
        body["duration_s"] = args.duration
    return show(args, client.post(f"compute-leases/{args.lease}/renew", body), keys=LEASE_DETAILS)


def lease_release(client: Client, args) -> int:
    lease = client.post(f"compute-leases/{args.lease}/release", {"message": args.message})
    return show(args, lease, keys=LEASE_DETAILS)


def lease_events(client: Client, args) -> int:
    return show(args, client.get(f"compute-leases/{args.lease}/events"), EVENT_COLUMNS)


# --- volumes ---------------------------------------------------------------------------------


def volumes(client: Client, args) -> int:
    filters = {"state": args.state, "pool__slug": args.pool, "tenant__slug": args.tenant}
    return show(args, client.list("volumes", limit=args.limit, **filters), VOLUME_COLUMNS)


def volume_show(client: Client, args) -> int:
    return show(args, client.get(f"volumes/{args.volume}"))


def volume_create(client: Client, args) -> int:
    body = {
        "tenant": default_tenant(client, args.tenant),
        "pool": args.pool or client.config.pool,
        "name": args.name,
        "size_mib": args.size,
    }
    if not body["pool"]:
        raise UsageError("give --pool (or POOLCTL_POOL)")
    for field in ("node", "zone", "retention_days"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    return show(args, client.post("volumes", body))


def volume_delete(client: Client, args) -> int:
    return show(args, client.delete(f"volumes/{args.volume}"))


def volume_export(client: Client, args) -> int:
    """Copies the volume to the tenant's registered bucket, as a job on the volume's node."""
    body = {"destination": args.destination}
    return show(args, client.post(f"volumes/{args.volume}/export", body))


def volume_events(client: Client, args) -> int:
    return show(args, client.get(f"volumes/{args.volume}/events"), EVENT_COLUMNS)
