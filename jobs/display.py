"""How the console words a job's figures (pure functions, unit-tested): human units, the
durations of a run read from its trace, the command line as a shell would take it back, and a
job's submit-form values for Resubmit / Clone."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime

from .trace import RUNNING, SCHEDULING


def cores(millicores) -> str:
    """1500 → "1.5 cores", 1000 → "1 core", 100 → "0.1 cores"."""
    if millicores is None:
        return "—"
    value = round(float(millicores) / 1000, 2)
    text = f"{value:g}"
    return f"{text} core" if value == 1 else f"{text} cores"


def gib(mib) -> str:
    """MiB as GiB past 1 GiB (two significant decimals), else MiB."""
    if mib is None:
        return "—"
    mib = float(mib)
    if mib >= 1024:
        return f"{round(mib / 1024, 2):g} GiB"
    return f"{round(mib):g} MiB"


def gpus(milli) -> str:
    """GPU thousandths as GPUs: 2000 → "2 GPUs", 500 → "0.5 GPU", 0 → "0 GPUs"."""
    if milli is None:
        return "—"
    value = round(float(milli) / 1000, 2)
    return f"{value:g} GPU" if 0 < value <= 1 else f"{value:g} GPUs"


def duration(seconds) -> str:
    """4000 → "1 h 6 min", 75 → "1 min 15 s", 9.4 → "9 s"."""
    if seconds is None:
        return "—"
    seconds = max(0, round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def job_durations(spans, *, max_runtime_s: int, ended: bool, now: datetime) -> dict:
    """From the job's trace spans (jobs/trace.py): seconds queued (every scheduling span), run
    (every running span), and, while a running span is open, what is left of the maximum
    runtime (the agent counts it per attempt, from the container's start)."""
    queued = ran = 0.0
    left = None
    for span in spans:
        end = span.end or now
        seconds = max(0.0, (end - span.start).total_seconds())
        if span.name == SCHEDULING:
            queued += seconds
        elif span.name == RUNNING:
            ran += seconds
            if span.end is None and not ended:
                left = max(0.0, max_runtime_s - seconds)
    return {"queued_s": queued, "ran_s": ran, "left_s": left}


def command_line(command) -> str:
    """The command as a shell line that gives it back: ["sh", "-c", "echo a; echo b"] →
    "sh -c 'echo a; echo b'" (the submit form splits it with shlex)."""
    return shlex.join(command or [])


def _lines(mapping) -> str:
    return "\n".join(f"{key}={value}" for key, value in (mapping or {}).items())


def clone_values(job) -> dict:
    """The submit form's values for a job like this one (Resubmit / Clone): its tenant, pool,
    shape (or its custom request), image as asked, command, and policies. Secrets keep their
    references only (never values: the job holds none)."""
    resources = job.resources or {}
    values = {
        "name": job.name,
        "tenant": job.tenant.slug,
        "pool": job.pool.slug,
        "image": job.image_requested or job.image,
        "command": command_line(job.command),
        "max_runtime_s": str(job.max_runtime_s),
        "env": _lines(job.env),
        "secrets": _lines(job.secrets),
        "labels": _lines(job.labels),
        "affinity": _lines(job.affinity),
        "affinity_preferred": _lines(job.affinity_preferred),
        "anti_affinity": _lines(job.anti_affinity),
        "ports": ", ".join(str(p) for p in job.ports or []),
        "inputs": "\n".join(
            i if isinstance(i, str) else i.get("url", "") for i in job.inputs or []
        ),
        "network_mode": (job.network_policy or {}).get("mode", "none"),
        "egress_allow": ", ".join((job.network_policy or {}).get("egress_allow", [])),
        "ingress_allow": ", ".join((job.network_policy or {}).get("ingress_allow", [])),
        "retry_max_attempts": str((job.retry_policy or {}).get("max_attempts", 1)),
        "retry_backoff_s": str((job.retry_policy or {}).get("backoff_s", 30)),
        "retry_on": list((job.retry_policy or {}).get("retry_on", [])),
        "anti_affinity_scope": job.anti_affinity_scope,
        "require_numa": "on" if job.require_numa else "",
        "output_destination": job.output_destination,
        "volumes": "\n".join(
            f"{m['volume']}:{m['path']}{':ro' if m.get('read_only') else ''}"
            for m in job.volumes or []
        ),
        "reservation": str(job.reservation_id or ""),
        "priority_class": job.priority_class.name if job.priority_class_id else "",
        "checkpointable": "on" if job.checkpointable else "",
        "gang_name": (job.gang or {}).get("name", ""),
        "gang_size": str((job.gang or {}).get("size", "")),
        "gang_topology": (job.gang or {}).get("topology", ""),
    }
    if job.shape_id:
        values |= {"shape_mode": "catalogue", "shape": job.shape.name}
    else:
        values["shape_mode"] = "custom"
        for key, value in resources.items():
            if value in (None, "", [], False):
                continue
            if isinstance(value, list):
                value = ", ".join(str(v) for v in value)
            elif value is True:
                value = "on"
            values[key] = str(value)
    return values


def _when(iso_text) -> str:
    """An API timestamp as the page says it: 2026-12-07 08:48 UTC."""
    at = datetime.fromisoformat(iso_text.replace("Z", "+00:00"))
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def storage_sentences(statement: dict) -> list[str]:
    """The job's storage statement (jobs/selectors.py `job_storage`) in plain sentences, for its
    page: what goes when the attempt ends, what is kept, until when, and where."""
    gone = statement["ephemeral"]
    sentences = [f"Deleted when an attempt ends: {'; '.join(gone)}."]
    for kept in statement["persists"]:
        if kept["what"] == "outputs" and kept["where"] == "control plane":
            days = kept["retention_days"]
            until = (
                f"until {_when(kept['until'])} ({days} days after the job ended)"
                if kept["until"]
                else f"for {days} days after the job ends"
            )
            sentences.append(
                f"Outputs are kept in the control plane, encrypted under the tenant's own key, "
                f"{until}; download them here or from {kept['fetch']}."
            )
        elif kept["what"] == "outputs":
            sentences.append(
                f"Outputs go to {kept['where']}, the tenant's bucket, and are fetched there; "
                "the control plane does not delete them."
            )
        else:
            where = f" on {kept['where']}" if kept.get("where") else ""
            mode = "read-only" if kept["read_only"] else "read-write"
            text = f"The {kept['what']} (at {kept['path']}, {mode}) persists{where}"
            if kept.get("until"):
                text += f" until {_when(kept['until'])}"
            elif kept.get("retention_days"):
                text += f", kept {kept['retention_days']} days after no job mounts it"
            sentences.append(text + ".")
    return sentences
