"""`make gpu-check` on a GPU machine (no Docker needed; MIG settings only read, never changed):
the control plane's own GPU challenge for this machine's real devices (nodes.challenge, the
pool knobs' defaults), run by the agent's own code in this process (worker_agent.probe's
process-runtime path → worker_agent/gpu_kernel.py over libcuda), verified by the control
plane's own check. Prints one JSON verdict; exits 1 when a GPU fails. See docs/nodes.md
"GPU challenge" for what it does not yet do (a control plane over HTTP and a separate agent)."""

import json
import os
import random
import sys
import time
from pathlib import Path

import django

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from nodes.challenge import build_gpu_challenge, gpu_challenge_differences  # noqa: E402
from nodes.conf import setting  # noqa: E402
from pools.knobs import DEFAULTS  # noqa: E402
from worker_agent.inventory import load_nvml, read_gpus  # noqa: E402
from worker_agent.probe import run_gpu_kernel  # noqa: E402


def main() -> int:
    started = time.monotonic()
    try:
        gpus = read_gpus(load_nvml())["gpus"]  # the real NVML inventory
    except Exception as exc:  # no driver: say so, as the agent would
        print(json.dumps({"passed": False, "error": f"NVML unavailable: {exc}"}))
        return 2
    challenge = build_gpu_challenge(
        gpus,
        classes=dict(DEFAULTS.gpu_throughput_classes),
        tolerance=DEFAULTS.gpu_throughput_tolerance,
        reserve_mib=setting("NODE_GPU_CHALLENGE_RESERVE_MIB"),
        samples=setting("NODE_GPU_CHALLENGE_SAMPLES"),
        fma_seconds=setting("NODE_GPU_CHALLENGE_FMA_SECONDS"),
        unclassed_gflops=setting("NODE_GPU_CHALLENGE_UNCLASSED_GFLOPS"),
        rng=random.SystemRandom(),
    )
    answer = run_gpu_kernel(
        0, {"gpus": challenge}, runtime=None, workdir=Path("/nonexistent"), nvml_gpus=gpus
    )
    diffs = gpu_challenge_differences(challenge, answer)
    skipped = [g["uuid"] for g in gpus if g.get("mig_enabled")]
    verdict = {
        "passed": bool(challenge) and not diffs,
        "differences": [{"reason": code, "difference": words} for code, words in diffs],
        "skipped_mig_enabled": skipped,
        "answer": answer,
        "challenge": [{k: v for k, v in g.items() if k != "samples"} for g in challenge],
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(verdict, indent=2))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
