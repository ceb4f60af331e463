"""The validation probe's challenge (pure): seeded work whose answer the control plane can check,
memory of the claimed size, the claimed GPUs; and what an answer says against it.

The agent runs the challenge in a container through its job path (worker_agent/probe.py):
`workers` chains in parallel (one per claimed CPU, bounded), chain i iterating sha256 over the
text `<seed>-<i>` `iterations` times (each round hashes the previous round's 64 hex characters,
as `printf %s "$x" | sha256sum` does); it fills `memory_mib` MiB of a tmpfs of that size and
lists the GPU UUIDs the container sees. Nobody can answer without doing the work: the seed is
fresh for every probe. The time budget is generous (a slow node is not a liar), so only a
duration far beyond what the claimed CPUs allow counts as a difference.
"""

from __future__ import annotations

import hashlib
import math
import random

from pools.reasons import Reason
from worker_agent.gpu_kernel import (
    FMA_B_MAX,
    FMA_PER_ITERATION,
    FMA_THREADS,
    expected_samples,
    fma_check_expected,
    fma_flops,
)

SEED_HEX = 32  # characters of a seed (128 bits)


def chain(seed: str, iterations: int) -> str:
    value = seed
    for _ in range(iterations):
        value = hashlib.sha256(value.encode()).hexdigest()
    return value


def expected_answers(challenge: dict) -> list[str]:
    seed, rounds = challenge["seed"], int(challenge["iterations"])
    return [chain(f"{seed}-{i}", rounds) for i in range(int(challenge["workers"]))]


def build_challenge(
    claims: dict,
    *,
    seed: str,
    image: str,
    iterations: int,
    workers_max: int,
    memory_max_mib: int,
    seconds_per_iteration: float,
    seconds_base: float,
) -> dict:
    """The challenge for a node claiming `claims` (its inventory)."""
    cpus = max(1, int(claims.get("cpu_millicores") or 0) // 1000)
    workers = max(1, min(cpus, workers_max))
    return {
        "seed": seed,
        "iterations": iterations,
        "workers": workers,
        "memory_mib": max(1, min(int(claims.get("memory_mib") or 0), memory_max_mib)),
        "gpus": [str(g.get("uuid")) for g in claims.get("gpus") or [] if g.get("uuid")],
        "image": image,
        # each chain has a CPU of its own when the claim is true: the budget does not grow
        # with the number of chains, so fewer real CPUs than claimed stretch the duration
        "seconds_max": round(seconds_base + math.ceil(iterations * seconds_per_iteration), 1),
    }


def challenge_differences(challenge: dict, answer: dict | None) -> list[str]:
    """Each way the answer contradicts the challenge, in words ([] when it holds)."""
    if not challenge:
        return []  # a probe requested before challenges existed: the claims alone decide
    if not answer:
        return ["challenge: no answer"]
    if answer.get("error"):
        return [f"challenge: the probe did not run: {str(answer['error'])[:200]}"]
    diffs = []
    answers = list(answer.get("answers") or [])
    wrong = sum(
        1
        for i, want in enumerate(expected_answers(challenge))
        if i >= len(answers) or answers[i] != want
    )
    if wrong or len(answers) != int(challenge["workers"]):
        diffs.append(
            f"challenge: wrong answer ({wrong} of {challenge['workers']} chains of "
            f"{challenge['iterations']} sha256 rounds differ)"
        )
    seconds = float(answer.get("seconds") or 0)
    if seconds > float(challenge["seconds_max"]):
        diffs.append(
            f"timing: {seconds:.1f}s for {challenge['workers']} parallel chains, the claimed "
            f"CPUs allow at most {challenge['seconds_max']}s"
        )
    claimed_mem = int(challenge["memory_mib"])
    filled = int(answer.get("memory_mib") or 0)
    if filled < claimed_mem:
        diffs.append(f"memory: {claimed_mem} MiB asked of the claimed memory, {filled} MiB filled")
    claimed_gpus, seen = set(challenge.get("gpus") or ()), set(answer.get("gpus") or ())
    for uuid in sorted(claimed_gpus - seen):
        diffs.append(f"gpu {uuid}: claimed, not visible in the probe container")
    for uuid in sorted(seen - claimed_gpus):
        diffs.append(f"gpu {uuid}: visible in the probe container, not claimed")
    return diffs


# --------------------------------------------------------------------------- the GPU challenge
# Per claimed GPU: a nonce, the bytes to fill (the claimed memory less a reserve for the driver),
# the 64-bit words to read back, and a timed FMA kernel sized to run about `fma_seconds` at the
# claimed model's class. The agent runs it on the device (worker_agent/gpu_kernel.py, through
# its runtime like a job); the answer is checked here against the same reference functions.
# What it proves and what it cannot: docs/nodes.md "GPU challenge".

GPU_NONCE_HEX = 16  # 64 bits
GPU_FMA_BLOCKS = 4096  # × FMA_THREADS = 1 Mi threads: every SM of any device busy


def build_gpu_challenge(
    gpus: list[dict],
    *,
    classes: dict,
    tolerance: float,
    reserve_mib: int,
    samples: int,
    fma_seconds: float,
    unclassed_gflops: float,
    rng: random.Random,
) -> list[dict]:
    """One challenge per claimed whole GPU (`gpus`: inventory entries). A MIG-enabled device
    is left out: CUDA sees its instances, not the device's whole memory."""
    challenges = []
    threads = GPU_FMA_BLOCKS * FMA_THREADS
    for gpu in gpus:
        if not gpu.get("uuid") or gpu.get("mig_enabled"):
            continue
        fill_mib = max(1, int(gpu.get("memory_mib") or 0) - reserve_mib)
        words = (fill_mib << 20) // 8
        indexes = {0, words - 1} | {rng.randrange(words) for _ in range(max(0, samples - 2))}
        model = str(gpu.get("model") or "")
        floor = classes.get(model)
        basis = float(floor or unclassed_gflops)
        fmas = basis * 1e9 * fma_seconds / 2
        challenges.append(
            {
                "uuid": str(gpu["uuid"]),
                "model": model,
                "nonce": f"{rng.getrandbits(GPU_NONCE_HEX * 4):0{GPU_NONCE_HEX}x}",
                "fill_bytes": fill_mib << 20,
                "samples": sorted(indexes),
                "fma_iterations": max(1, math.ceil(fmas / (threads * FMA_PER_ITERATION))),
                "fma_blocks": GPU_FMA_BLOCKS,
                "fma_b": rng.randrange(4, FMA_B_MAX),
                # None: a model without a class is measured, not judged
                "gflops_min": round(float(floor) * (1 - tolerance), 1) if floor else None,
            }
        )
    return challenges


def gpu_gflops(gpu: dict, fma_seconds: float) -> float:
    """The throughput the answer's own duration gives, recomputed from the kernel's size."""
    return fma_flops(gpu) / max(float(fma_seconds), 1e-9) / 1e9


def gpu_challenge_differences(challenge: list[dict], answer: dict | None) -> list[tuple[str, str]]:
    """(reason code, words) for each way a GPU answer contradicts its challenge ([] when none):
    gpu_challenge_missing (no answer, an error), gpu_challenge_wrong (a sample, the FMA check,
    the model, an answer for a device not asked), gpu_challenge_slow (below its class)."""
    if not challenge:
        return []
    wrong, slow, missing = (
        Reason.GPU_CHALLENGE_WRONG.value,
        Reason.GPU_CHALLENGE_SLOW.value,
        Reason.GPU_CHALLENGE_MISSING.value,
    )
    answer = answer or {}
    if answer.get("error") or not answer.get("gpus"):
        why = str(answer.get("error") or "no answer")[:200]
        return [
            (missing, f"gpu {gpu['uuid']}: the challenge did not run: {why}") for gpu in challenge
        ]
    answers: dict[str, dict] = {}
    for item in answer["gpus"]:
        answers.setdefault(str(item.get("uuid")), item)
    diffs = []
    for gpu in challenge:
        label = f"gpu {gpu['uuid']}"
        got = answers.get(gpu["uuid"])
        if got is None:
            diffs.append((missing, f"{label}: claimed, no challenge answer"))
            continue
        if got.get("error"):
            diffs.append((missing, f"{label}: the challenge did not run: {got['error'][:200]}"))
            continue
        want = expected_samples(gpu["nonce"], gpu["samples"])
        seen = list(got.get("samples") or [])
        bad = sum(1 for i, word in enumerate(want) if i >= len(seen) or seen[i] != word)
        if bad or len(seen) != len(want):
            diffs.append(
                (wrong, f"{label}: {bad} of {len(want)} sampled words differ from the fill")
            )
        check = got.get("fma_check")
        if check is None or float(check) != fma_check_expected(gpu["fma_b"]):
            diffs.append((wrong, f"{label}: the FMA kernel's check value is {check}, not its own"))
        model = got.get("model")
        if model is not None and gpu.get("model") and model != gpu["model"]:
            diffs.append((wrong, f"{label}: claimed {gpu['model']}, the device is {model}"))
        seconds = float(got.get("fma_seconds") or 0)
        if seconds <= 0:
            diffs.append((wrong, f"{label}: no duration of the FMA kernel"))
        elif gpu.get("gflops_min") and gpu_gflops(gpu, seconds) < gpu["gflops_min"]:
            diffs.append(
                (
                    slow,
                    f"{label}: {gpu_gflops(gpu, seconds):.0f} GFLOP/s, its class "
                    f"({gpu.get('model')}) asks at least {gpu['gflops_min']:.0f}",
                )
            )
    asked = {gpu["uuid"] for gpu in challenge}
    for uuid in sorted(set(answers) - asked):
        diffs.append((wrong, f"gpu {uuid[:80]}: an answer for a device not asked"))
    return diffs


GPU_REASON_ORDER = (
    Reason.GPU_CHALLENGE_WRONG.value,
    Reason.GPU_CHALLENGE_MISSING.value,
    Reason.GPU_CHALLENGE_SLOW.value,
)


def gpu_reason(codes) -> str | None:
    """The one reason of a verdict: a wrong answer before a missing one before a slow one."""
    codes = set(codes)
    return next((code for code in GPU_REASON_ORDER if code in codes), None)
