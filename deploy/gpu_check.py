"""`make gpu-check`: the GPU challenge's whole path, once, on this machine (docs/nodes.md "GPU
challenge"). No Docker, no CUDA toolkit, no network beyond loopback; MIG settings are read (by
NVML, as the agent's inventory reads them), never changed.

1. records the real NVML inventory as a test fixture (`python -m worker_agent.inventory
   record` → tests/worker_agent/fixtures/nvml_<model>.json); without a driver: skipped, said;
2. starts a throwaway control plane in a temp dir: its own SQLite database (migrated), a key
   ring (`manage.py encryption_key --init-file`), runstack's embedded Redis-protocol server
   (the nonce store of signed agent requests, the channel layer), the ASGI server on a free
   loopback port (runstack's `web_command`); a marketplace pool whose knobs carry the GPU
   challenge's classes (config.builders), an enrollment token, an operator's API token;
3. starts the real agent as a separate process (`python -m worker_agent --runtime process`,
   runstack's `agent_command`: its state dir and key in the temp dir, the token in its
   environment): it enrolls over HTTP with signed requests, the enrollment requests the
   validation probe with its `gpu_kernel` challenge, the agent runs the kernel in its own
   process and posts the signed result;
4. waits (bounded) for the probe's verdict; reads the node and its events back over the API
   (the operator's token) and the probe's result from the database; prints ONE JSON object and
   exits 0 when every GPU passed, else 1; tears everything down (processes, the temp dir) also
   on failure, Ctrl-C or SIGTERM (`--keep` keeps the temp dir and its logs).

The whole run stays under 6 minutes (`--seconds`, 320 by default, bounds it before teardown;
the Makefile's `timeout` guards that bound).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "worker_agent" / "fixtures"
POOL_SLUG = "gpu-check"
RECORD_SECONDS = 60
LOG_TAIL = 2000
sys.path.insert(0, str(ROOT))  # run as `python deploy/gpu_check.py`


def record_fixture(fixtures: Path) -> tuple[str | None, str]:
    """(the fixture written, what happened); (None, why) without NVML. In a subprocess: a
    driver that hangs costs RECORD_SECONDS, not the run."""
    command = [sys.executable, "-m", "worker_agent.inventory", "record"]
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=RECORD_SECONDS
        )
    except subprocess.TimeoutExpired:
        return None, f"NVML recording ran past {RECORD_SECONDS}s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return None, f"no NVIDIA driver: {lines[-1]}"
    recording = json.loads(done.stdout)
    devices = recording.get("devices") or []
    if not devices:
        return None, "no NVIDIA GPU: NVML lists no device"
    model = devices[0]["name"].lower().removeprefix("nvidia ")
    model = "_".join("".join(c if c.isalnum() else " " for c in model).split())
    fixtures.mkdir(parents=True, exist_ok=True)
    path = fixtures / f"nvml_{model}.json"
    path.with_suffix(".tmp").write_text(done.stdout)
    path.with_suffix(".tmp").replace(path)
    return str(path), f"recorded {len(devices)} device(s)"


def isolate_environment(tmp: Path) -> None:
    """This process's and its children's settings: everything in `tmp`, nothing shared with a
    `make run` or a deployment on this machine (set before Django reads its settings)."""
    for name in (
        "ENCRYPTION_KEYS",
        "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND",
        "CHANNEL_LAYER_PREFIX",
        "DEPLOYMENT_PREFIX",
        "OUTPUTS_TO_OBJECT_STORE",
    ):
        os.environ.pop(name, None)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}",
        ENCRYPTION_KEYS_FILE=str(tmp / "encryption-keys"),
        MEDIA_ROOT=str(tmp / "media"),
        SECRET_KEY=secrets.token_urlsafe(50),
        DEBUG="false",
        # this process never talks to Redis; its children get the embedded server
        REDIS_URL="redis://127.0.0.1:1/0",
    )


def control_plane(tmp: Path) -> tuple:
    """(the pool, an operator's API token, the server's environment): the database migrated,
    the key ring, the marketplace pool, the operator; runstack's embedded Redis. Django is set
    up here, on the temp dir's settings."""
    import django

    django.setup()
    from django.core.management import call_command

    from config.builders import build_person, build_pool, build_token, set_pool_knobs
    from config.management.commands.runstack import stack_environment, start_embedded_redis
    from pools.choices import PlatformRole, TrustLevel
    from pools.knobs import DEFAULTS

    call_command("migrate", verbosity=0, interactive=False)
    call_command("encryption_key", init_file=True, stdout=io.StringIO())  # stdout: the verdict
    pool = build_pool(POOL_SLUG, trust_level=TrustLevel.MARKETPLACE, registry=None)
    set_pool_knobs(
        pool,
        gpu_throughput_classes=dict(DEFAULTS.gpu_throughput_classes),
        gpu_throughput_tolerance=DEFAULTS.gpu_throughput_tolerance,
        allow_process_runtime=True,  # the node's runtime (its jobs would not be isolated)
        output_limit_mib=0,
    )
    operator = build_person("gpu-check", platform_role=PlatformRole.OPERATOR)
    api_token = build_token(operator, scopes=["read", "operate"], name="gpu-check")
    # the nonces of the agent's signed requests, the channel layer: none shared with anyone
    env = stack_environment(start_embedded_redis(), tmp / "metrics")
    return pool, api_token, env


def node_environment(env: dict) -> dict:
    """The agent's environment: runstack's (a node's own view, none of the control plane's
    secrets) and the loader path where the driver's libraries may be, without this machine's
    WORKER_AGENT_* settings (an enrollment token file there would win over the drill's)."""
    from config.management.commands.runstack import agent_environment

    own = {k: v for k, v in agent_environment(env).items() if not k.startswith("WORKER_AGENT_")}
    return own | {k: env[k] for k in ("LD_LIBRARY_PATH",) if k in env}


def api_get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return ""


def gpu_lines(challenge: list[dict], answer: dict) -> list[dict]:
    """Per challenged GPU: what the control plane asked and what the kernel answered, its
    throughput recomputed as the control plane does."""
    from nodes.challenge import gpu_gflops

    answers = {g.get("uuid"): g for g in answer.get("gpus") or [] if isinstance(g, dict)}
    lines = []
    for gpu in challenge:
        got = answers.get(gpu["uuid"], {})
        seconds = float(got.get("fma_seconds") or 0)
        lines.append(
            {
                "uuid": gpu["uuid"],
                "model": gpu["model"],
                "memory_mib": got.get("memory_mib"),
                "cuda_name": got.get("cuda_name"),
                "fill_mib": gpu["fill_bytes"] >> 20,
                "fill_seconds": got.get("fill_seconds"),
                "fma_seconds": got.get("fma_seconds"),
                "gflops": round(gpu_gflops(gpu, seconds), 1) if seconds > 0 else None,
                "gflops_min": gpu.get("gflops_min"),
                "error": got.get("error") or answer.get("error"),
            }
        )
    return lines


def verdict(node, probe, api: str, token: str, nvml_note: str) -> dict:
    """The node as the API shows it, the probe's verdict, the GPUs' answers."""
    from nodes.choices import ProbeState

    shown = api_get(f"{api}/api/v1/nodes/{node.pk}/", token)
    events = api_get(f"{api}/api/v1/nodes/{node.pk}/events/", token)
    kernel = (probe.challenge or {}).get("gpu_kernel") or {}
    challenge = kernel.get("gpus") or []
    inventory = (node.inventory or {}).get("gpus") or []
    result = {
        "node": {
            "id": node.pk,
            "name": shown["name"],
            "state": shown["state"],
            "gpus": len(inventory),
            "key_fingerprint": node.identity_fingerprint,
            "events": [
                f"{e['reason']}: {e['from_state'] or '(none)'} -> {e['to_state']}" for e in events
            ],
        },
        "probe": {
            "id": probe.pk,
            "state": probe.state,
            "reasons": sorted(
                {e["reason"] for e in events if e["reason"].startswith(("probe_", "gpu_chal"))}
            ),
            "differences": probe.differences,
        },
        "gpus": gpu_lines(challenge, (probe.result or {}).get("gpu_kernel") or {}),
        "skipped_mig_enabled": [g.get("uuid") for g in inventory if g.get("mig_enabled")],
    }
    passed = probe.state == ProbeState.PASSED and shown["state"] == "ready"
    if not inventory:
        result["error"] = nvml_note if "NVIDIA" in nvml_note else f"no NVIDIA GPU: {nvml_note}"
    elif not challenge:
        result["error"] = "no whole GPU to challenge (every device is MIG-enabled)"
    elif not passed:
        result["error"] = "the probe failed: " + "; ".join(probe.differences)[:1000]
    result["passed"] = passed and bool(challenge)
    return result


def wait_for_verdict(pool, processes: dict, deadline: float):
    """(node, probe) once the node's validation probe has its verdict; raises RuntimeError when
    a process ends or the deadline passes first."""
    from nodes.choices import ProbeKind, ProbeState
    from nodes.models import Node, NodeProbe

    node = probe = None
    while time.monotonic() < deadline:
        for name, process in processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"the {name} exited with {process.returncode}")
        node = Node.objects.filter(pool=pool).first()
        probe = node and NodeProbe.objects.filter(node=node, kind=ProbeKind.VALIDATION).first()
        if probe and probe.state != ProbeState.REQUESTED:
            return node, probe
        time.sleep(1)
    said = "no node enrolled" if not node else f"node {node.state}, probe {probe and probe.state}"
    raise RuntimeError(f"no verdict in time ({said})")


def run(args, tmp: Path, out: dict, processes: dict) -> None:
    started = time.monotonic()
    deadline = started + args.seconds
    timings = out["timings"]
    out["fixture"], note = record_fixture(Path(args.fixture_dir))
    out["fixture_note"] = note
    print(f"gpu-check: fixture: {out['fixture'] or 'skipped'} ({note})", file=sys.stderr)
    timings["fixture_s"] = round(time.monotonic() - started, 1)

    isolate_environment(tmp)
    pool, api_token, env = control_plane(tmp)
    from config.management.commands.runstack import (
        _free_port,
        agent_command,
        wait_for_http,
        web_command,
    )

    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    web_log = open(tmp / "web.log", "wb")  # noqa: SIM115 - closed with the temp dir
    processes["web server"] = subprocess.Popen(
        web_command("127.0.0.1", port), cwd=ROOT, env=env, stdout=web_log, stderr=web_log
    )
    if not wait_for_http(f"{api}/healthz", timeout=max(1, min(60, deadline - time.monotonic()))):
        raise RuntimeError("the web server did not answer")
    timings["control_plane_s"] = round(time.monotonic() - started, 1)

    # a new node's state dir (its key beside it) in the temp dir, the token in its environment
    plan = agent_command(api=api, pool=POOL_SLUG, runtime="process", root=tmp / "agent")
    agent_log = open(tmp / "agent.log", "wb")  # noqa: SIM115
    processes["agent"] = subprocess.Popen(
        [*plan.command, "--log-format", "json", "--poll-s", "1"],
        cwd=ROOT,
        env=node_environment(env) | plan.env,
        stdout=agent_log,
        stderr=agent_log,
    )
    node, probe = wait_for_verdict(pool, processes, deadline)
    timings["verdict_s"] = round(time.monotonic() - started, 1)
    out |= verdict(node, probe, api, api_token, note)


def interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture-dir", default=str(FIXTURES), help="where the fixture goes")
    parser.add_argument(
        "--seconds", type=float, default=320, help="bound of the whole check before teardown"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out: dict = {"passed": False, "timings": {}}
    processes: dict = {}
    try:
        run(args, tmp, out, processes)
    except (Exception, KeyboardInterrupt) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["logs"] = {name: tail(tmp / f"{name}.log") for name in ("web", "agent")}
    finally:
        if processes:  # started once Django was set up
            from django.db import connections

            from config.management.commands.runstack import stop_processes

            stop_processes(reversed(processes.values()))  # the agent first, then the server
            connections.close_all()
        if args.keep:
            out["kept"] = str(tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        out["timings"]["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
