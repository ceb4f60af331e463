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
